"""Tiny configurations of every registry entry for the layer tests, and the NaN poisoning
of allocations (a read of memory nobody wrote then shows up as NaN in the output)."""

import contextlib
import math

import torch

# name -> (options of subquad.layers.build with dim and heads, token count T). Every
# registry entry appears at least once; a second configuration covers the other mode.
CASES = {
    "exact": (dict(dim=16, heads=4, kv_heads=2, causal=True), 7),
    "exact-bidirectional": (dict(dim=16, heads=4, causal=False), 6),
    "sliding-window": (dict(dim=16, heads=4, kv_heads=1, window=3), 9),
}


def entry(case: str) -> str:
    """The registry name of a case ("exact-bidirectional" -> "exact")."""
    import subquad.layers as layers
    return case if case in layers.names() else case.rsplit("-", 1)[0]


def build(case: str, **overrides):
    import subquad.layers as layers
    options, tokens = CASES[case]
    options = {**options, **overrides}
    return layers.build(entry(case), **options), tokens


def _poisoned(factory):
    def allocate(*args, **kwargs):
        tensor = factory(*args, **kwargs)
        if tensor.is_floating_point() or tensor.is_complex():
            with torch.no_grad():
                tensor.fill_(math.nan)
        return tensor
    return allocate


@contextlib.contextmanager
def nan_poisoned_allocations():
    """torch.empty, empty_like, empty_strided and Tensor.new_empty return NaN-filled memory."""
    saved = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    saved_new_empty = torch.Tensor.new_empty
    try:
        for name, factory in saved.items():
            setattr(torch, name, _poisoned(factory))
        torch.Tensor.new_empty = _poisoned(saved_new_empty)
        yield
    finally:
        for name, factory in saved.items():
            setattr(torch, name, factory)
        torch.Tensor.new_empty = saved_new_empty
