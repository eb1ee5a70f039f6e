"""The operators on hostile input through the Python API: thread counts out of range,
zero-volume inputs with large other sides, non-finite inputs, masked entries filled with
non-finite values, caches used right after construction, and allocation failure under an
address-space limit (MemoryError, never a crash)."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import subquad

NAN, INF = float("nan"), float("inf")


def qkv(rng, n=12, m=12, h=2, hkv=1, d=8, dv=4, dtype=np.float32):
    return (rng.standard_normal((1, n, h, d)).astype(dtype),
            rng.standard_normal((1, m, hkv, d)).astype(dtype),
            rng.standard_normal((1, m, hkv, dv)).astype(dtype))


def grid(rng, dtype=np.float32):
    return tuple(rng.standard_normal((1, 3, 4, 2, 4)).astype(dtype) for _ in range(3))


# Every operator with a `threads` argument, on small valid inputs.
OPERATORS = {
    "exact": lambda r, **kw: subquad.exact_attention_forward(*qkv(r), causal=True, **kw),
    "mlr": lambda r, **kw: subquad.mlr_attention_forward(*qkv(r), ranks=[4, 4], causal=True, **kw),
    "cat": lambda r, **kw: subquad.cat_forward(r.standard_normal((1, 12, 2)).astype(np.float32),
                                               qkv(r, h=2, hkv=2)[2], **kw),
    "cat_causal": lambda r, **kw: subquad.cat_causal_forward(
        r.standard_normal((1, 12, 2)).astype(np.float32), qkv(r, h=2, hkv=2)[2], **kw),
    "cat_avgkey": lambda r, **kw: subquad.cat_avgkey_forward(*qkv(r, h=2, hkv=2), **kw),
    "circulant2d": lambda r, **kw: subquad.circulant2d_forward(*grid(r), **kw),
    "wildcat": lambda r, **kw: subquad.wildcat_attention(*qkv(r), rank=4, **kw),
}


@pytest.mark.parametrize("name", sorted(OPERATORS))
@pytest.mark.parametrize("threads", [-1, 1025, 100000])
def test_threads_outside_the_range_are_refused(name, threads, rng):
    with pytest.raises(ValueError, match="threads: expected 0 \\(all cores\\) to 1024"):
        OPERATORS[name](rng, threads=threads)


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_many_threads_are_capped_at_the_cores(name, rng):
    OPERATORS[name](rng, threads=1024)  # runs on at most the cores, no libgomp stack overflow


def test_zero_volume_with_large_sides_returns_at_once():
    big = 10**9
    z = np.empty((big, 0, 3), np.float32)
    v = np.empty((big, 0, 3, 2), np.float32)
    q = np.empty((big, 0, 3, 4), np.float32)
    start = time.monotonic()
    assert subquad.cat_forward(z, v).shape == v.shape
    assert subquad.cat_causal_forward(z, v).shape == v.shape
    assert subquad.cat_avgkey_forward(q, q, v).shape == v.shape
    out, lse = subquad.exact_attention_forward(q, q, v)
    assert out.shape == (big, 0, 3, 2) and lse.shape == (big, 3, 0)
    out, lse = subquad.mlr_attention_forward(q, q, v, ranks=[4])
    assert out.size == 0
    assert subquad.wildcat_attention(q, q, v, rank=4).size == 0
    assert time.monotonic() - start < 5.0


@pytest.mark.parametrize("bad", [NAN, INF])
def test_non_finite_keys_and_values_propagate(bad, rng):
    """Policy (docs/conventions.md): non-finite input propagates, never a silent zero."""
    q, k, v = qkv(rng, n=16, m=40)
    k_bad = k.copy()
    k_bad[0, 7, 0, 3] = bad if bad != bad else -bad  # NaN, or -inf (no softmax escape)
    v_bad = v.copy()
    v_bad[0, 9, 0, 1] = bad
    exact = subquad.exact_attention_forward(q, k, v_bad)[0]
    assert np.isnan(exact[..., 1]).all() or np.isinf(exact[..., 1]).all()
    # WildCat mixes every key of a kv group into its coreset: the whole group is NaN.
    assert np.isnan(subquad.wildcat_attention(q, k, v_bad, rank=8)).all()
    assert np.isnan(subquad.wildcat_attention(q, k_bad, v, rank=8)).all()
    selection = subquad.CompressKV(sink=2, window=2, bin_rank=4).select(k, v_bad)
    out = subquad.weighted_kv_attention(q, *subquad.weighted_kv_entries(k, v_bad, *selection))
    assert not np.isfinite(out[..., 1]).all()


def test_masked_entries_never_influence_outputs(rng):
    """Causal exact, sliding window, MLR and causal CAT: rows that cannot see a token are
    unchanged when it holds NaN, inf or a huge value (models pad sequences)."""
    n = 131
    q, k, v = qkv(rng, n=n, m=n, dtype=np.float64)
    z = rng.standard_normal((1, n, 2))
    vz = rng.standard_normal((1, n, 2, 4))
    clean = {
        "causal": subquad.exact_attention_forward(q, k, v, causal=True)[0],
        "window": subquad.exact_attention_forward(q, k, v, window=5)[0],
        "mlr": subquad.mlr_attention_forward(q, k, v, ranks=[8], causal=True)[0],
        "cat": subquad.cat_causal_forward(z, vz),
    }
    for hostile in (NAN, INF, 1e30):
        kh, vh = k.copy(), v.copy()
        kh[0, -1], vh[0, -1] = hostile, hostile
        np.testing.assert_array_equal(
            subquad.exact_attention_forward(q, kh, vh, causal=True)[0][:, :-1],
            clean["causal"][:, :-1])
        np.testing.assert_array_equal(
            subquad.mlr_attention_forward(q, kh, vh, ranks=[8], causal=True)[0][:, :-1],
            clean["mlr"][:, :-1])
        kw, vw = k.copy(), v.copy()
        kw[0, 0], vw[0, 0] = hostile, hostile  # outside the window of rows 5 and on
        np.testing.assert_array_equal(
            subquad.exact_attention_forward(q, kw, vw, window=5)[0][:, 5:], clean["window"][:, 5:])
        if not np.isfinite(hostile):
            vzh = vz.copy()
            vzh[0, -1] = hostile
            np.testing.assert_allclose(subquad.cat_causal_forward(z, vzh)[:, :-1],
                                       clean["cat"][:, :-1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("call", [
    lambda: subquad.CompressKV().bins(-1),
    lambda: subquad.mlr_key_cache_prediction(-5, [4, 4]),
    lambda: subquad.mlr_key_cache_prediction(16, []),
    lambda: subquad.mlr_key_cache_prediction(2**62, [2**40] * 3),
    lambda: subquad.bilinear_mlr_output_dim([]),
    lambda: subquad.bilinear_mlr_output_dim([-3, 2]),
    lambda: subquad.bilinear_mlr_output_dim([2**62, 2**62]),
    lambda: subquad.mlr_score_macs(-4, [4]),
    lambda: subquad.mlr_score_macs(4, [0]),
    lambda: subquad.rms_cap_limit(0, 4),
    lambda: subquad.rms_cap_limit(4, -1),
    lambda: subquad.bilinear_mlr_level_scales([-1, 0]),
    lambda: subquad.wildcat_temperature(-1.0, 1.0, 1.0, 10),
    lambda: subquad.wildcat_temperature(1.0, float("inf"), 1.0, 10),
    lambda: subquad.wildcat_temperature(1.0, 1.0, 1.0, 0),
    lambda: subquad.btt_factors(2**62 + 1),
    lambda: subquad.circulant2d_grid_for_tokens(2**62 + 1),
])
def test_numeric_helpers_refuse_out_of_range_arguments(call):
    start = time.monotonic()
    with pytest.raises(ValueError):
        call()
    assert time.monotonic() - start < 1.0  # no unbounded scan before the refusal


def test_numeric_helpers_keep_their_values():
    assert subquad.btt_factors(16) == (2, 8) and subquad.btt_factors(13) == (1, 13)
    assert subquad.btt_factors(2**40) == (2**19, 2**21)
    assert subquad.circulant2d_grid_for_tokens(12) == (3, 4)
    assert subquad.bilinear_mlr_output_dim([4, 2]) == 8
    assert subquad.mlr_key_cache_prediction(16, [4, 4]) == 4 * 16 + 4 * 8


def test_negative_view_is_not_read_as_its_base():
    torch = pytest.importorskip("torch")
    x = torch.randn(1, 6, 1, 4)
    negated = x._neg_view()
    try:
        out = subquad.exact_attention_forward(negated, x, x)[0]
    except (ValueError, TypeError, RuntimeError):
        return  # refused: fine
    want = subquad.exact_attention_forward((-x).numpy(), x.numpy(), x.numpy())[0]
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


# The end of each script below: runs calls[argv[1]] under an address-space limit a little
# above what the process holds (the outputs, 4 MiB and more, do not fit); exit 0 and print
# on MemoryError, exit 3 when the call succeeded.
UNDER_LIMIT = textwrap.dedent("""
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    limit = used + (2 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        calls[sys.argv[1]]()
    except MemoryError as error:
        print("MemoryError:", error)
        sys.exit(0)
    sys.exit(3)
""")


def expect_memory_error(script, name):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    result = subprocess.run([sys.executable, "-c", script + UNDER_LIMIT, name],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-2000:])
    assert "MemoryError" in result.stdout


OPERATOR_UNDER_LIMIT = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import subquad
    rng = np.random.default_rng(0)
    n, h, d = 2048, 8, 64
    q = rng.standard_normal((1, n, h, d)).astype(np.float32)
    z = rng.standard_normal((1, n, h)).astype(np.float32)
    g = q.reshape(1, 32, 64, h, d)
    head = q[:, :64]
    entries = subquad.weighted_kv_entries(head, head, *subquad.streaming_llm_select(head, head))
    calls = {
        "exact": lambda: subquad.exact_attention_forward(q, q, q, causal=True),
        "mlr": lambda: subquad.mlr_attention_forward(q, q, q, ranks=[32, 32]),
        "cat": lambda: subquad.cat_forward(z, q),
        "cat_causal": lambda: subquad.cat_causal_forward(z, q),
        "cat_causal_decode": lambda: subquad.cat_causal_decode(z, q, tokens=n),
        "cat_avgkey": lambda: subquad.cat_avgkey_forward(q, q, q),
        "circulant2d": lambda: subquad.circulant2d_forward(g, g, g),
        "wildcat": lambda: subquad.wildcat_attention(q, q, q, rank=64),
        "compress_kv": lambda: subquad.weighted_kv_entries(q, q, *subquad.CompressKV(
            compression_ratio=0.0).select(q, q)),
        "weighted_kv_attention": lambda: subquad.weighted_kv_attention(q, *entries),
    }
""")


@pytest.mark.parametrize("name", sorted(OPERATORS) + ["cat_causal_decode", "compress_kv",
                                                     "weighted_kv_attention"])
def test_allocation_failure_is_memory_error(name):
    expect_memory_error(OPERATOR_UNDER_LIMIT, name)


def test_negative_views_are_materialised_for_weighted_kv_and_compress_kv():
    """Weighted KV attention and CompressKV.select read -x for x._neg_view()."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 6, 1, 4, generator=generator)
    minus = (-x).contiguous()
    every = subquad.streaming_llm_select(x, x, sink=6, window=0)
    entries = subquad.weighted_kv_entries(x, x, *every)
    compressor = subquad.CompressKV(sink=1, window=1, bin_rank=2)
    checks = {
        "weighted_kv_attention": [subquad.weighted_kv_attention(q, *entries)
                                  for q in (x._neg_view(), minus)],
        "weighted_kv_entries": [subquad.weighted_kv_entries(x, v, *every)[1]
                                for v in (x._neg_view(), minus)],
        "CompressKV.select": [compressor.select(x, v)[1] for v in (x._neg_view(), minus)],
    }
    for name, (got, want) in checks.items():
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)


