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
    "exact-rope": (dict(dim=16, heads=2, causal=False, rope=True, rope_base=100.0), 7),
    "sliding-window-rope": (dict(dim=16, heads=4, kv_heads=2, window=3, rope=True), 9),
    "cat": (dict(dim=16, heads=4), 7),
    "cat-conv": (dict(dim=16, heads=2, convention="conv"), 6),
    "cat-avgkey": (dict(dim=16, heads=4, scale=0.5), 7),
    "cat-causal": (dict(dim=16, heads=4), 7),
    "circulant2d": (dict(dim=8, heads=4, grid=(3, 4), scale_mode="paper"), 12),
    "circulant2d-auto-grid": (dict(dim=8, heads=8), 15),
    "mlr": (dict(dim=16, heads=2, ranks=[4, 2, 2], kv_heads=1, context=12), 12),
    "mlr-bidirectional": (dict(dim=16, heads=2, ranks=[2, 2], causal=False, block_divide=True),
                          8),
    "bilinear-mlr": (dict(dim=16, heads=2, ranks=[2, 2]), 7),
    "bilinear-mlr-bidirectional": (dict(dim=16, heads=2, ranks=[2, 1, 1], causal=False,
                                        mup=True), 6),
    "btt": (dict(dim=16, heads=2, rank=2), 7),
    "btt-bidirectional": (dict(dim=12, heads=3, causal=False, mup=True), 6),
    "wildcat": (dict(dim=16, heads=4, kv_heads=2, rank=64), 10),
}


def entry(case: str) -> str:
    """The registry name of a case ("exact-bidirectional" -> "exact")."""
    import subquad.layers as layers
    while case not in layers.names():
        case = case.rsplit("-", 1)[0]
    return case


def build(case: str, *, keep_init: bool = False, **overrides):
    """The layer of a case and its T. muP zero-initialises output projections, which would
    make every output 0: unless keep_init, those weights are redrawn N(0, 1 / fan_in)."""
    import subquad.layers as layers
    options, tokens = CASES[case]
    options = {**options, **overrides}
    layer = layers.build(entry(case), **options)
    if options.get("mup") and not keep_init:
        with torch.no_grad():
            for module in layer.modules():
                if isinstance(module, torch.nn.Linear) and not module.weight.any():
                    module.weight.normal_(std=module.in_features ** -0.5)
    return layer, tokens


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
