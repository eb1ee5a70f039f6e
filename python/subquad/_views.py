"""Torch tensors whose negative or conjugate bit is set (``x._neg_view()``, ``x.conj()``)
are lazy views: their memory holds ``x``, not ``-x``. Through DLPack or the buffer protocol
the operators would read ``+x``; every public function of subquad therefore materialises
such arguments first (``resolve_neg``/``resolve_conj``, a copy), before they reach C++,
and so does every public method of its classes (decoders, caches, CompressKV)."""

import atexit
import contextlib
import functools

_TORCH_TENSOR = None


def _tensor_type():
    global _TORCH_TENSOR
    if _TORCH_TENSOR is None:
        import sys

        torch = sys.modules.get("torch")  # never imports torch itself
        if torch is None:
            return None
        _TORCH_TENSOR = torch.Tensor
    return _TORCH_TENSOR


def _resolved(value):
    tensor = _tensor_type()
    if tensor is not None and isinstance(value, tensor) and (value.is_neg() or value.is_conj()):
        return value.resolve_neg().resolve_conj()
    if isinstance(value, (list, tuple)):
        return type(value)(_resolved(item) for item in value)
    return value


def materialising(function):
    """`function` with lazy negative / conjugate torch views materialised in its arguments."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*(_resolved(a) for a in args),
                        **{key: _resolved(value) for key, value in kwargs.items()})

    return wrapper


# (class, {name: original method}) of every class materialise_methods has wrapped.
_WRAPPED = []


def materialise_methods(cls):
    """Wraps every public method of the extension class `cls` in `materialising`. The
    originals are put back at exit: a Python function in an extension type's dict holds the
    module alive past nanobind's leak check, which would report the types as leaked."""
    originals = {name: attr for name, attr in vars(cls).items()
                 if not name.startswith("_") and callable(attr)}
    for name, method in originals.items():
        setattr(cls, name, materialising(method))
    if not _WRAPPED:
        atexit.register(_restore)
    _WRAPPED.append((cls, originals))


def _restore():
    for cls, originals in _WRAPPED:
        for name, method in originals.items():
            setattr(cls, name, method)


@contextlib.contextmanager
def original_methods():
    """The extension classes with their own methods for a while (the stub generator reads
    their signatures, which the Python wrappers hide)."""
    _restore()
    try:
        yield
    finally:
        for cls, originals in _WRAPPED:
            for name, method in originals.items():
                setattr(cls, name, materialising(method))
