"""subquad.ops: the torch custom operators. torch.library.opcheck on every operator, the C++
kernels against subquad.reference through the dispatcher (forward and backward), the
reference path that other devices take, and outputs the kernels write whole."""

import numpy as np
import pytest
import torch

import subquad
from subquad import _core, ops, reference

torch.manual_seed(0)


def rand(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


def sequence_last(*shape, dtype=torch.float64):
    """[B, N, *rest] as a view of contiguous [B, *rest, N] memory (what CAT reads in place)."""
    B, N, *rest = shape
    x = torch.randn(B, *rest, N, dtype=dtype)
    return x.permute(0, x.dim() - 1, *range(1, x.dim() - 1))


# One call per forward operator on odd sizes: (id, operator, tensors, options in the order
# of the operator's schema).
CASES = [
    ("exact_attention", "exact_attention",
     lambda: (rand(2, 7, 4, 5), rand(2, 11, 2, 5), rand(2, 11, 2, 3)),
     dict(scale=None, causal=True, window=6, threads=0)),
    ("exact_attention decode", "exact_attention",  # one query, GQA: the folded path
     lambda: (rand(2, 1, 6, 5), rand(2, 9, 2, 5), rand(2, 9, 2, 3)),
     dict(scale=0.4, causal=True, window=0, threads=0)),
    ("merge_attention", "merge_attention",
     lambda: (rand(2, 5, 3, 4), rand(2, 3, 5), rand(2, 5, 3, 4), rand(2, 3, 5)),
     dict(threads=0)),
    ("cat", "cat", lambda: (rand(2, 13, 3), rand(2, 13, 3, 5)),
     dict(convention="conv", path="automatic", threads=0)),
    ("cat sequence-last", "cat", lambda: (sequence_last(2, 13, 3), sequence_last(2, 13, 3, 5)),
     dict(convention="roll", path="fft", threads=1)),
    ("cat_avgkey", "cat_avgkey",
     lambda: (rand(2, 11, 3, 4), rand(2, 11, 3, 4), rand(2, 11, 3, 5)),
     dict(scale=0.3, convention="roll", path="automatic", threads=0)),
    ("cat_causal", "cat_causal", lambda: (rand(1, 17, 2), rand(1, 17, 2, 3)),
     dict(path="automatic", threads=0)),
    ("cat_causal sequence-last", "cat_causal",
     lambda: (sequence_last(1, 17, 2), sequence_last(1, 17, 2, 3)),
     dict(path="automatic", threads=0)),
    ("cat_causal_decode", "cat_causal_decode", lambda: (rand(2, 13, 3), rand(2, 13, 3, 5)),
     dict(tokens=4, threads=0)),
    ("circulant2d", "circulant2d",
     lambda: (rand(2, 3, 5, 2, 4), rand(2, 3, 5, 2, 4), rand(2, 3, 5, 2, 3)),
     dict(scale_mode="code", scale=None, threads=0)),
    ("mlr_attention", "mlr_attention",
     lambda: (rand(2, 12, 4, 6), rand(2, 12, 2, 6), rand(2, 12, 2, 5)),
     dict(ranks=[3, 2, 1], causal=True, block_divide=True, threads=0)),
    ("mlr_decode", "mlr_decode",  # positions 9 and 10: one finest block of 3 (context 12)
     lambda: (rand(2, 2, 4, 6), [rand(2, 2, 12, 3), rand(2, 2, 6, 2), rand(2, 2, 3, 1)],
              rand(2, 11, 2, 5)),
     dict(ranks=[3, 2, 1], block_divide=True, context=12, threads=0)),
    ("bilinear_mlr_project", "bilinear_mlr_project",
     lambda: (rand(2, 5, 12), [rand(1, 12, 2 * 3), rand(2, 6, 2 * 2)]),
     dict(ranks=[3, 2], heads=2, level_scale=[1.0, 0.5], layer_norm=True, rms_cap=True,
          threads=0)),
    ("btt_project", "btt_project",
     lambda: (rand(2, 5, 15), rand(3, 5, 2 * 5 * 2), rand(2 * 5, 3, 3 * 2)),
     dict(heads=2, rank=2, layer_norm=True, rms_cap=True, threads=0)),
    ("wildcat_attention", "wildcat_attention",
     lambda: (rand(1, 5, 2, 4), rand(1, 40, 2, 4), rand(1, 40, 2, 3)),
     dict(rank=8, bins=2, seed=3, scale=None, method="wildcat", query_radius="keys",
          threads=0)),
]
# Inference only: WildCat, and decoding (the state of a decode loop).
NO_GRAD = {"wildcat_attention", "cat_causal_decode", "mlr_decode"}
DIFFERENTIABLE = [case for case in CASES if case[1] not in NO_GRAD]


def ids(cases):
    return [case[0] for case in cases]


def flat(tensors):
    """The tensors of an argument tuple whose items are tensors or lists of tensors."""
    for t in tensors:
        yield from (t if isinstance(t, list) else [t])


def call(name, tensors, options):
    """The operator's outputs as a tuple."""
    result = ops.OPERATORS[name](*tensors, *options.values())
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def differentiable(outputs):
    return [o for o in outputs if o.requires_grad]


def layout(t):
    """The strides that matter: those of dimensions longer than 1."""
    return tuple(stride if size > 1 else None for size, stride in zip(t.shape, t.stride()))


def with_grad(tensors):
    for t in flat(tensors):
        t.requires_grad_(True)
    return tensors


def test_every_operator_is_registered_with_a_fake_and_its_backward():
    forwards = {name for name in ops.OPERATORS if not name.endswith("_backward")}
    assert forwards == {*ops.__all__}
    for name in forwards - NO_GRAD:
        assert f"{name}_backward" in ops.OPERATORS
    for name in ops.OPERATORS:
        assert hasattr(torch.ops.subquad, name)


@pytest.mark.parametrize("case, name, make, options", CASES, ids=ids(CASES))
def test_opcheck(case, name, make, options):
    tensors = make() if name in NO_GRAD else with_grad(make())
    torch.library.opcheck(ops.OPERATORS[name], (*tensors, *options.values()))


@pytest.mark.parametrize("case, name, make, options", DIFFERENTIABLE, ids=ids(DIFFERENTIABLE))
def test_kernels_match_the_reference_forward_and_backward(case, name, make, options):
    tensors = with_grad(make())
    leaves = list(flat(tensors))
    outputs = call(name, tensors, options)
    dout = [torch.randn_like(o) for o in differentiable(outputs)]
    grads = torch.autograd.grad(differentiable(outputs), leaves, dout)
    with ops.reference_on_cpu():
        expected = call(name, tensors, options)
        expected_grads = torch.autograd.grad(differentiable(expected), leaves, dout)
    for actual, wanted in zip((*outputs, *grads), (*expected, *expected_grads)):
        assert actual.shape == wanted.shape and actual.dtype == wanted.dtype
        assert layout(actual) == layout(wanted)
        assert torch.isfinite(actual).all() and actual.abs().max() > 0
        torch.testing.assert_close(actual, wanted, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("case, name, make, options", DIFFERENTIABLE, ids=ids(DIFFERENTIABLE))
def test_the_kernels_backward_matches_finite_differences(case, name, make, options):
    tensors = with_grad(make())
    if name == "bilinear_mlr_project":  # the weights arrive as one list argument
        x, weights = tensors
        function = lambda x, *w: call(name, (x, list(w)), options)  # noqa: E731
        assert torch.autograd.gradcheck(function, (x, *weights))
    else:
        assert torch.autograd.gradcheck(lambda *x: call(name, x, options), tensors)


def test_the_reference_path_runs_no_kernel(monkeypatch):
    """What a CUDA tensor meets: with the CPU kernels disabled, the dispatcher sends CPU
    tensors to the reference, and no C++ kernel runs."""
    def refuse(*args, **kwargs):
        raise AssertionError("a C++ kernel ran")

    for name in dir(_core):
        if name.endswith(("_forward", "_backward", "_decode")) or name in ("merge_attention",
                                                              "wildcat_attention"):
            monkeypatch.setattr(_core, name, refuse)
    q, k, v = rand(1, 5, 2, 4), rand(1, 9, 2, 4), rand(1, 9, 2, 3)
    with ops.reference_on_cpu():
        for _, name, make, options in DIFFERENTIABLE:
            tensors = with_grad(make())
            outputs = differentiable(call(name, tensors, options))
            torch.autograd.grad(outputs, list(flat(tensors)),
                                [torch.ones_like(o) for o in outputs])
        for _, name, make, options in CASES:
            if name.endswith("_decode"):
                call(name, make(), options)
        out = ops.wildcat_attention(q, k, v, rank=16)  # rank >= M: the exact coreset
    torch.testing.assert_close(out, reference.exact_attention(q, k, v)[0])
    with pytest.raises(AssertionError, match="a C\\+\\+ kernel ran"):  # the kernels are back
        ops.cat(rand(1, 5, 2), rand(1, 5, 2, 3))


@pytest.mark.parametrize("query_radius", ["keys", "queries"])
def test_wildcat_on_cpu_is_the_kernel_in_float32(query_radius):
    q, k, v = rand(1, 5, 2, 4), rand(1, 40, 2, 4), rand(1, 40, 2, 3)
    out = ops.wildcat_attention(q, k, v, rank=8, bins=2, seed=3, query_radius=query_radius)
    expected = _core.wildcat_attention(q.float().numpy(), k.float().numpy(), v.float().numpy(),
                                       rank=8, bins=2, seed=3, query_radius=query_radius)
    assert out.dtype == torch.float64
    np.testing.assert_array_equal(out.float().numpy(), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_compute_in_float32(dtype):
    q, k, v = (rand(1, 9, 2, 8, dtype=torch.float32) for _ in range(3))
    out, lse = ops.exact_attention(q.to(dtype), k.to(dtype), v.to(dtype))
    assert out.dtype == dtype and lse.dtype == torch.float32
    expected, _ = ops.exact_attention(q.to(dtype).float(), k.to(dtype).float(),
                                      v.to(dtype).float())
    torch.testing.assert_close(out.float(), expected, rtol=0, atol=2e-2)
    z, values = rand(1, 9, 2, dtype=dtype), rand(1, 9, 2, 3, dtype=dtype)
    assert ops.cat(z, values).dtype == dtype


def test_outputs_are_torch_allocated_and_written_whole():
    """The kernels write into torch tensors (no NumPy in between), and write every element:
    outputs pre-filled with NaN come back equal to NumPy-allocated ones."""
    nan_filled = {"float32": torch.float32, "float64": torch.float64,
                  "bfloat16": torch.bfloat16}

    def allocate(shape, dtype):
        return torch.full(shape, float("nan"), dtype=nan_filled[dtype])

    for _, name, make, options in CASES:
        tensors = make()
        out = call(name, tensors, options)
        assert all(isinstance(o, torch.Tensor) for o in out)
        with subquad.outputs_from(allocate):
            again = call(name, tensors, options)
        for a, b in zip(out, again):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=False)


def test_outputs_from_refuses_a_wrong_allocation():
    z, v = rand(1, 5, 2).numpy(), rand(1, 5, 2, 3).numpy()
    for allocate, message in [(lambda s, d: 3, "expected a writable CPU array"),
                              (lambda s, d: torch.empty(s, dtype=torch.float32), "dtype"),
                              (lambda s, d: torch.empty(s[::-1], dtype=torch.float64), "shape"),
                              (lambda s, d: torch.empty(*s[:-1], 2 * s[-1],
                                                        dtype=torch.float64)[..., ::2],
                               "non-contiguous")]:
        with pytest.raises(ValueError, match=message), subquad.outputs_from(allocate):
            subquad.cat_forward(z, v)
    assert isinstance(subquad.cat_forward(z, v), np.ndarray)  # the block ended


@pytest.mark.parametrize("block_elements", [1, 7 * 13, 10 ** 9])
def test_the_reference_in_row_blocks_equals_one_block(block_elements, monkeypatch):
    """The dense reference methods run their query rows in blocks (bounded memory): any
    block size gives the same values and gradients, to round-off."""
    from subquad.reference import operators
    cases = [c for c in DIFFERENTIABLE if c[1] in ("exact_attention", "cat_causal",
                                                   "mlr_attention")]
    results = {}
    for size in (10 ** 9, block_elements):
        monkeypatch.setattr(operators, "SCORE_BLOCK_ELEMENTS", size)
        with ops.reference_on_cpu():
            for case, name, make, options in cases:
                torch.manual_seed(1)
                tensors = with_grad(make())
                outputs = differentiable(call(name, tensors, options))
                grads = torch.autograd.grad(outputs, list(flat(tensors)),
                                            [torch.ones_like(o) for o in outputs])
                results.setdefault(case, []).append((*outputs, *grads))
    for case, (whole, blocked) in results.items():
        for a, b in zip(whole, blocked):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12, msg=case)
