"""Three sweeps over every forward and every backward of the Python API (docs/conventions.md):

- zero volume: an empty input returns at once, with empty outputs or, where an output
  still has volume (gradients of keys no query reads, weights of a projection of no tokens),
  zeros;
- non-finite input: a NaN or inf anywhere reaches the outputs (never a silent finite value)
  and nothing else: with two batch elements, poisoning batch 1 leaves batch 0 exactly as it
  was;
- masked entries: tokens a row cannot see (causal future, padding) change none of its
  outputs, forward or backward, whatever they hold.
"""

import time

import numpy as np
import pytest

import subquad

NAN, INF = float("nan"), float("inf")
B, N, H, HKV, D, DV = 2, 8, 2, 1, 4, 3
RANKS = [2, 2]  # MLR ranks summing to D; bilinear MLR ranks for Dm = 8


def normal(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def exact_inputs(rng, dtype=np.float64, n=N, m=N, b=B):
    return {"q": normal(rng, b, n, H, D, dtype=dtype), "k": normal(rng, b, m, HKV, D, dtype=dtype),
            "v": normal(rng, b, m, HKV, DV, dtype=dtype)}


def with_forward(inputs, forward):
    """Adds the forward's out (and lse) and a dout to attention inputs, for a backward."""
    result = forward(**inputs)
    out, lse = result if isinstance(result, tuple) else (result, None)
    inputs = dict(inputs, out=out, dout=np.random.default_rng(5).standard_normal(out.shape))
    if lse is not None:
        inputs["lse"] = lse
    return inputs


def exact_forward(q, k, v):
    return subquad.exact_attention_forward(q, k, v, causal=True)


def mlr_forward(q, k, v):
    return subquad.mlr_attention_forward(q, k, v, ranks=RANKS, causal=True)


def cat_causal_inputs(rng):
    return {"z": normal(rng, B, N, H), "v": normal(rng, B, N, H, DV)}


def merge_inputs(rng):
    return {"out_a": normal(rng, B, N, H, DV), "lse_a": normal(rng, B, H, N),
            "out_b": normal(rng, B, N, H, DV), "lse_b": normal(rng, B, H, N)}


def grid_inputs(rng):
    return {name: normal(rng, B, 2, 4, H, D) for name in ("q", "k", "v")}


def bilinear_inputs(rng):
    return {"x": normal(rng, B, 5, 8),
            "weights": [normal(rng, 2**l, 8 // 2**l, 2 * RANKS[l]) for l in range(len(RANKS))]}


def btt_inputs(rng):
    a, b = subquad.btt_factors(8)
    return {"x": normal(rng, B, 5, 8), "w1": normal(rng, a, b, 2 * b), "w2": normal(rng, 2 * b, a, a)}


def with_dy(inputs, forward):
    y = forward(**inputs)
    return dict(inputs, dy=np.random.default_rng(6).standard_normal(y.shape))


def bilinear_forward(x, weights):
    return subquad.bilinear_mlr_project_forward(x, weights, ranks=RANKS, heads=2)


def btt_forward(x, w1, w2):
    return subquad.btt_project_forward(x, w1, w2, heads=2, rank=1)


def compress_attend(q, k, v):
    selection = subquad.CompressKV(sink=2, window=2, bin_rank=2).select(k, v)
    return subquad.weighted_kv_attention(q, *subquad.weighted_kv_entries(k, v, *selection))


# name -> (inputs(rng), call(**inputs) -> outputs, names of inputs without a batch axis,
#          indices of outputs without one)
CASES = {
    "exact": (exact_inputs, exact_forward, (), ()),
    "exact_window": (exact_inputs, lambda q, k, v: subquad.exact_attention_forward(q, k, v, window=3),
                     (), ()),
    "merge": (merge_inputs, subquad.merge_attention, (), ()),
    "mlr": (exact_inputs, mlr_forward, (), ()),
    "cat": (cat_causal_inputs, subquad.cat_forward, (), ()),
    "cat_causal": (cat_causal_inputs, subquad.cat_causal_forward, (), ()),
    "cat_avgkey": (lambda r: {n: normal(r, B, N, H, D) for n in "qkv"}, subquad.cat_avgkey_forward,
                   (), ()),
    "circulant2d": (grid_inputs, subquad.circulant2d_forward, (), ()),
    "wildcat": (lambda r: exact_inputs(r, np.float32),
                lambda q, k, v: subquad.wildcat_attention(q, k, v, rank=4), (), ()),
    "compress_kv": (lambda r: exact_inputs(r, np.float32, m=12), compress_attend, (), ()),
    "bilinear_mlr_project": (bilinear_inputs, bilinear_forward, ("weights",), ()),
    "btt_project": (btt_inputs, btt_forward, ("w1", "w2"), ()),
    # backwards
    "exact_backward": (
        lambda r: with_forward(exact_inputs(r), exact_forward),
        lambda **a: subquad.exact_attention_backward(**a, causal=True), (), ()),
    "merge_backward": (
        lambda r: dict(merge_inputs(r), **dict(zip(("out", "lse"), subquad.merge_attention(
            **merge_inputs(np.random.default_rng(r.integers(99)))))),
            dout=normal(r, B, N, H, DV), dlse=normal(r, B, H, N)),
        subquad.merge_attention_backward, (), ()),
    "mlr_backward": (
        lambda r: with_forward(exact_inputs(r), mlr_forward),
        lambda **a: subquad.mlr_attention_backward(**a, ranks=RANKS, causal=True), (), ()),
    "cat_backward": (lambda r: dict(cat_causal_inputs(r), dout=normal(r, B, N, H, DV)),
                     subquad.cat_backward, (), ()),
    "cat_causal_backward": (
        lambda r: with_forward(cat_causal_inputs(r), subquad.cat_causal_forward),
        subquad.cat_causal_backward, (), ()),
    "cat_avgkey_backward": (
        lambda r: dict({n: normal(r, B, N, H, D) for n in "qkv"}, dout=normal(r, B, N, H, D)),
        subquad.cat_avgkey_backward, (), ()),
    "circulant2d_backward": (lambda r: dict(grid_inputs(r), dout=normal(r, B, 2, 4, H, D)),
                             subquad.circulant2d_backward, (), ()),
    "bilinear_mlr_project_backward": (
        lambda r: with_dy(bilinear_inputs(r), bilinear_forward),
        lambda x, weights, dy: subquad.bilinear_mlr_project_backward(
            x, weights, dy, ranks=RANKS, heads=2), ("weights",), (1, 2)),
    "btt_project_backward": (
        lambda r: with_dy(btt_inputs(r), btt_forward),
        lambda x, w1, w2, dy: subquad.btt_project_backward(x, w1, w2, dy, heads=2, rank=1),
        ("w1", "w2"), (1, 2)),
}


SCORE_LIKE = {"q", "k", "z", "lse", "lse_a", "lse_b"}


def outputs_of(result):
    """The output arrays of a call, flattened (tuples and lists of arrays)."""
    if isinstance(result, np.ndarray):
        return [result]
    return [array for item in result for array in outputs_of(item)]


def poison(value, bad, rng):
    """An unbatched input (a weight, or the first of a list of weights) with one random entry
    set to `bad`."""
    if isinstance(value, list):
        return [poison(value[0], bad, rng)] + value[1:]
    poisoned = value.copy()
    index = tuple(int(rng.integers(size)) for size in value.shape)
    poisoned[index] = bad
    return poisoned


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("bad", [NAN, INF])
def test_non_finite_input_reaches_the_outputs_and_nothing_else(name, bad, rng):
    make, call, unbatched_inputs, unbatched_outputs = CASES[name]
    inputs = make(rng)
    clean = outputs_of(call(**inputs))
    for arg in inputs:
        poisoned = dict(inputs)
        if arg in unbatched_inputs:
            poisoned[arg] = poison(inputs[arg], bad, rng)
        else:
            # Batch element 1 only, so batch 0 must be untouched.
            value = inputs[arg].copy()
            index = (1,) + tuple(int(rng.integers(size)) for size in value.shape[1:])
            value[index] = bad
            poisoned[arg] = value
        got = outputs_of(call(**poisoned))
        # An inf score or log-normaliser may legitimately be a weight of zero (-inf score,
        # exp(s - inf)): only NaN, and inf in values, gradients and activations, must show.
        if bad != bad or arg not in SCORE_LIKE:
            assert not all(np.isfinite(g).all() for g in got), f"{arg} = {bad}: all finite"
        if arg in unbatched_inputs:
            continue
        for index, (g, c) in enumerate(zip(got, clean)):
            if index not in unbatched_outputs:
                np.testing.assert_array_equal(g[0], c[0], err_msg=f"{arg}: batch 0, output {index}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_zero_volume_returns_at_once(name):
    make, call, unbatched_inputs, _ = CASES[name]
    inputs = make(np.random.default_rng(0))
    # (A cache holds state per (batch, kv head): 10^9 of them is a real allocation.)
    big = 10**9 if name != "compress_kv" else 3
    empty = {}
    for arg, value in inputs.items():
        if arg in unbatched_inputs:
            empty[arg] = value  # weights keep their shape; the tokens are what is empty
        elif name.startswith("circulant2d"):
            empty[arg] = np.empty((0,) + value.shape[1:], value.dtype)  # B = 0 (a grid is >= 1 x 1)
        elif arg.startswith("lse") or arg == "dlse":
            empty[arg] = np.empty((big, value.shape[1], 0), value.dtype)
        else:
            empty[arg] = np.empty((big, 0) + value.shape[2:], value.dtype)
    start = time.monotonic()
    got = outputs_of(call(**empty))
    assert time.monotonic() - start < 2.0
    for index, array in enumerate(got):
        if array.size:  # only gradients of weights have volume: no token contributes
            assert not array.any(), f"output {index} of {name} is not zero"


def test_zero_query_backward_gives_zero_key_gradients(rng):
    """N = 0 queries over M = 8 keys: dk and dv have volume and must be zeros."""
    inputs = with_forward(exact_inputs(rng, n=0, m=8), exact_forward)
    dq, dk, dv = subquad.exact_attention_backward(**inputs, causal=True)
    assert dq.size == 0 and dk.shape == inputs["k"].shape and dv.shape == inputs["v"].shape
    assert not dk.any() and not dv.any()


# ---- masked entries: the causal operators, forward and backward ------------------------
L = 5  # rows 0 .. L-1 are the real tokens; L .. N-1 padding (seen only by padding rows)

MASKED_FORWARD = {
    "exact": (exact_inputs, exact_forward, ("k", "v")),
    "mlr": (exact_inputs, mlr_forward, ("k", "v")),
    "cat_causal": (cat_causal_inputs, subquad.cat_causal_forward, ("z", "v")),
}


def pad(inputs, names, hostile):
    padded = dict(inputs)
    for name in names:
        value = inputs[name].copy()
        value[:, L:] = hostile
        padded[name] = value
    return padded


@pytest.mark.parametrize("name", sorted(MASKED_FORWARD))
@pytest.mark.parametrize("hostile", [NAN, INF, -INF, 1e30])
def test_masked_entries_never_influence_forward_rows(name, hostile, rng):
    make, call, names = MASKED_FORWARD[name]
    inputs = make(rng)
    clean = outputs_of(call(**inputs))
    got = outputs_of(call(**pad(inputs, names, hostile)))
    np.testing.assert_allclose(got[0][:, :L], clean[0][:, :L], rtol=1e-12, atol=1e-12)
    if len(got) > 1:  # lse [B, H, N]
        np.testing.assert_allclose(got[1][..., :L], clean[1][..., :L], rtol=1e-12, atol=1e-12)


MASKED_BACKWARD = {
    "exact": (exact_inputs, exact_forward,
              lambda **a: subquad.exact_attention_backward(**a, causal=True), ("k", "v")),
    "mlr": (exact_inputs, mlr_forward,
            lambda **a: subquad.mlr_attention_backward(**a, ranks=RANKS, causal=True), ("k", "v")),
    "cat_causal": (cat_causal_inputs, subquad.cat_causal_forward, subquad.cat_causal_backward,
                   ("z", "v")),
}


def backward_of(inputs, forward, backward):
    """Gradients of a loss over the real rows only (dout = 0 on the padding rows), through
    the forward's own out (and lse)."""
    full = with_forward(inputs, forward)
    full["dout"][:, L:] = 0
    return outputs_of(backward(**full))


@pytest.mark.parametrize("name", sorted(MASKED_BACKWARD))
@pytest.mark.parametrize("hostile", [1e30, -1e30, 1e300])
def test_masked_entries_never_influence_gradients(name, hostile, rng):
    """Padding holding huge finite values: every gradient of the real tokens is as with
    ordinary padding (a loss over the real rows does not depend on what padding holds)."""
    make, forward, backward, names = MASKED_BACKWARD[name]
    inputs = make(rng)
    clean = backward_of(inputs, forward, backward)
    got = backward_of(pad(inputs, names, hostile), forward, backward)
    for index, (g, c) in enumerate(zip(got, clean)):
        np.testing.assert_allclose(g[:, :L], c[:, :L], rtol=1e-9, atol=1e-12,
                                   err_msg=f"{name} gradient {index}")


@pytest.mark.parametrize("name", ["exact", "mlr"])
@pytest.mark.parametrize("hostile", [NAN, INF])
def test_masked_non_finite_entries_never_reach_the_query_gradients_of_real_rows(
        name, hostile, rng):
    """Non-finite padding: the rows that never see it keep their dq (IEEE arithmetic carries
    NaN into dk and dv of real tokens only through the padding rows' own 0 * NaN). Both
    backwards once multiplied masked dS (0) by the NaN keys of their diagonal tiles."""
    make, forward, backward, names = MASKED_BACKWARD[name]
    inputs = make(rng)
    clean = backward_of(inputs, forward, backward)
    got = backward_of(pad(inputs, names, hostile), forward, backward)
    np.testing.assert_allclose(got[0][:, :L], clean[0][:, :L], rtol=1e-12, atol=1e-12)


def test_scores_beyond_float_range_are_non_finite_input_everywhere(rng):
    """q, k entries of 1e20 in float32: scores of ~1e40 overflow. Every operator returns
    NaN there (exact, MLR: the rows; 2D circulant: the head; WildCat: the kv group) instead
    of some refusing with an error; the other batch element is untouched."""
    q, k, v = (x.astype(np.float32) for x in exact_inputs(rng).values())
    qb, kb = q.copy(), k.copy()
    qb[1] *= 1e20
    kb[1] *= 1e20
    calls = {
        "exact": lambda q, k, v: subquad.exact_attention_forward(q, k, v)[0],
        "mlr": lambda q, k, v: subquad.mlr_attention_forward(q, k, v, ranks=RANKS)[0],
        "wildcat": lambda q, k, v: subquad.wildcat_attention(q, k, v, rank=4),
        "circulant2d": lambda q, k, v: subquad.circulant2d_forward(
            q.reshape(B, 2, 4, H, D), np.repeat(k, H, axis=2).reshape(B, 2, 4, H, D),
            np.repeat(v, H, axis=2).reshape(B, 2, 4, H, DV))[0],
    }
    for name, call in calls.items():
        clean, got = call(q, k, v), call(qb, kb, v)
        assert np.isnan(got[1]).all(), name
        np.testing.assert_array_equal(got[0], clean[0], err_msg=name)
    # 1e18 still fits float32 scores (~1e36): exact attention is finite there (one-hot rows).
    assert np.isfinite(subquad.exact_attention_forward(q * 1e18, k * 1e18, v)[0]).all()


@pytest.mark.parametrize("scale", [0.0, -1.0, NAN, INF])
def test_scales_outside_the_positive_reals_are_refused(scale, rng):
    q, k, v = grid_inputs(rng).values()
    with pytest.raises(ValueError, match="scale"):
        subquad.circulant2d_forward(q, k, v, scale=scale)
    with pytest.raises(ValueError, match="scale"):
        subquad.cat_avgkey_forward(*(normal(rng, B, N, H, D) for _ in range(3)), scale=scale)
    with pytest.raises(ValueError, match="scale"):
        subquad.exact_attention_forward(*exact_inputs(rng).values(), scale=scale)


def test_causal_cat_paths_are_the_documented_ones(rng):
    """"fft" is a documented path of causal CAT (its FFT blocks' oracle) and agrees with
    "direct"; anything else is refused naming the option."""
    z, v = cat_causal_inputs(rng).values()
    np.testing.assert_allclose(subquad.cat_causal_forward(z, v, path="fft"),
                               subquad.cat_causal_forward(z, v, path="direct"), atol=1e-12)
    with pytest.raises(ValueError, match="path"):
        subquad.cat_causal_forward(z, v, path="blocked")
