"""WildCat bindings: coreset attention against exact attention in its exact limits,
determinism, the weighted KV cache against a NumPy reference, CompressKV, StreamingLLM and
SnapKV caches, and the scalar helpers."""

import numpy as np
import pytest
from conftest import reference_of

import subquad
from subquad import reference

F32 = np.float32


def attention_reference(q, k, v, scale=None):
    """Exact softmax attention in float64 (subquad.reference)."""
    return reference_of(reference.exact_attention, q, k, v, scale=scale)[0]


def inputs(rng, B=2, N=5, M=24, H=4, Hkv=2, D=8, Dv=3):
    return (rng.standard_normal((B, N, H, D)).astype(F32),
            rng.standard_normal((B, M, Hkv, D)).astype(F32),
            rng.standard_normal((B, M, Hkv, Dv)).astype(F32))


@pytest.mark.parametrize("method", ["wildcat", "uniform_nystrom", "uniform_subsample"])
def test_full_rank_is_exact_attention(rng, method):
    q, k, v = inputs(rng)
    out = subquad.wildcat_attention(q, k, v, rank=k.shape[1], method=method)
    if method != "wildcat":  # the command line spells these with "-"
        cli_spelling = method.replace("_", "-")
        np.testing.assert_array_equal(
            out, subquad.wildcat_attention(q, k, v, rank=k.shape[1], method=cli_spelling))
    assert out.dtype == F32 and out.shape == (2, 5, 4, 3)
    np.testing.assert_allclose(out, attention_reference(q, k, v), atol=2e-4)


def test_low_rank_is_deterministic_and_bounded(rng):
    q, k, v = inputs(rng, M=64)
    out = subquad.wildcat_attention(q, k, v, rank=16, bins=2, seed=7)
    np.testing.assert_array_equal(out, subquad.wildcat_attention(q, k, v, rank=16, bins=2,
                                                                 seed=7))
    assert not np.array_equal(out, subquad.wildcat_attention(q, k, v, rank=16, bins=2, seed=8))
    # The output is clamped to the per-feature value range of its kv head.
    vv = np.repeat(v, 2, axis=2)
    assert np.all(out >= vv.min(axis=1, keepdims=True) - 1e-6)
    assert np.all(out <= vv.max(axis=1, keepdims=True) + 1e-6)
    exact = attention_reference(q, k, v)
    assert np.max(np.abs(out - exact)) < np.max(np.abs(exact)) + np.max(np.abs(v))


def test_query_radius_keys_builds_the_coreset_from_the_keys_alone(rng):
    """One outlier query (10x the norm) sets R_Q = max ||q||, hence the temperature and the
    coreset of its whole group; with R_Q = R_K (the default) the other queries' outputs do
    not move."""
    q, k, v = inputs(rng, N=6, M=200)
    outlier = q.copy()
    outlier[:, 0] *= 10
    default = subquad.wildcat_attention(q, k, v, rank=12)
    np.testing.assert_array_equal(default, subquad.wildcat_attention(q, k, v, rank=12,
                                                                     query_radius="keys"))
    for query_radius, unmoved in (("keys", True), ("queries", False)):
        before = subquad.wildcat_attention(q, k, v, rank=12, query_radius=query_radius)
        after = subquad.wildcat_attention(outlier, k, v, rank=12, query_radius=query_radius)
        assert np.isfinite(after).all() and np.abs(before).max() > 0
        assert np.array_equal(before[:, 1:], after[:, 1:]) == unmoved, query_radius


def test_helpers():
    for x in (0.0, 0.5, 1.0, 10.0, 1e6):
        w = subquad.lambert_w0(x)
        assert w * np.exp(w) == pytest.approx(x, rel=1e-12, abs=1e-15)
    beta, radius_q, radius_k, n = 0.25, 3.0, 2.0, 100
    b = np.log(n) / (beta * radius_q * radius_k) + 2
    tau = np.sqrt(radius_k / radius_q * b / (2 * subquad.lambert_w0(b / 6.383202050647408)))
    assert subquad.wildcat_temperature(beta, radius_q, radius_k, n) == pytest.approx(tau)


def cache_reference(q, keys, values, log_scales, vmin, vmax, scale):
    """One (batch, head): clamp(sum p v / sum p w) over entries with weight last, where
    entry i counts as exp(log_scales[i]) * values[i]."""
    s = scale * q.astype(np.float64) @ keys.T.astype(np.float64) + log_scales
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    out = (p @ values[:, :-1]) / (p @ values[:, -1:])
    return np.clip(out, vmin, vmax)


def entries_attend(q, k, v, selection, **options):
    """weighted_kv_attention over the entries of a selection of k, v."""
    return subquad.weighted_kv_attention(q, *subquad.weighted_kv_entries(k, v, *selection),
                                         **options)


def test_weighted_kv_attention(rng):
    q, k, v = inputs(rng, B=1, N=3, M=6, H=2, Hkv=1, D=4, Dv=2)
    every = subquad.streaming_llm_select(k, v, sink=6, window=0)
    keys, values, log_scales, lengths, vmin, vmax = subquad.weighted_kv_entries(k, v, *every)
    assert keys.shape == (1, 1, 6, 4) and values.shape == (1, 1, 6, 3) and lengths.dtype == np.int64
    np.testing.assert_array_equal(keys[0, 0], k[0, :, 0])
    np.testing.assert_array_equal(values[0, 0, :, :2], v[0, :, 0])
    np.testing.assert_array_equal(values[0, 0, :, 2], 1)
    np.testing.assert_array_equal(vmin[0, 0], v[0, :, 0].min(axis=0))
    # Weight-1 entries of every token are exact attention, clamped or not.
    np.testing.assert_allclose(subquad.weighted_kv_attention(q, keys, values, log_scales),
                               attention_reference(q, k, v), atol=1e-5)
    np.testing.assert_allclose(entries_attend(q, k, v, every), attention_reference(q, k, v),
                               atol=1e-5)
    # Entries of the caller's own: a coreset entry folded by 3 and one with a log scale.
    key = rng.standard_normal(4).astype(F32)
    value = rng.standard_normal(2).astype(F32)
    keys = np.concatenate([keys, key[None, None, None], -key[None, None, None]], axis=2)
    values = np.concatenate([values, np.r_[3 * value, 3.0].astype(F32)[None, None, None],
                             np.r_[value, 1.0].astype(F32)[None, None, None]], axis=2)
    log_scales = np.concatenate([log_scales, np.array([[[0.0, 2.5]]], F32)], axis=2)
    vmin, vmax = np.minimum(vmin, value), np.maximum(vmax, value)
    out = subquad.weighted_kv_attention(q, keys, values, log_scales, None, vmin, vmax, scale=0.3)
    for h in range(2):
        expected = cache_reference(q[0, :, h], keys[0, 0], values[0, 0], log_scales[0, 0],
                                   vmin[0, 0], vmax[0, 0], 0.3)
        np.testing.assert_allclose(out[0, :, h], expected, atol=1e-5)
    # lengths: entries past a head's length are never read (even NaN ones).
    poisoned = keys.copy()
    poisoned[0, 0, 6:] = np.nan
    np.testing.assert_array_equal(
        subquad.weighted_kv_attention(q, poisoned, values, log_scales, np.array([[6]])),
        subquad.weighted_kv_attention(q, keys[:, :, :6], values[:, :, :6], log_scales[:, :, :6]))

    with pytest.raises(ValueError, match="values"):
        subquad.weighted_kv_attention(q, keys, values[:, :, :3], log_scales)
    with pytest.raises(ValueError, match="value_min"):
        subquad.weighted_kv_attention(q, keys, values, log_scales, None, vmin, None)
    with pytest.raises(ValueError, match="lengths"):
        subquad.weighted_kv_attention(q, keys, values, log_scales, np.array([[9]]))
    with pytest.raises(ValueError, match="float32"):
        subquad.weighted_kv_attention(q.astype(np.float64), keys, values, log_scales)
    bad = list(every)
    bad[2] = bad[2].copy()
    bad[2][0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="weight must be finite"):
        subquad.weighted_kv_entries(k, v, *bad)
    bad = list(every)
    bad[0] = bad[0].copy()
    bad[0][0, 0, 0] = 6
    with pytest.raises(ValueError, match="index 6"):
        subquad.weighted_kv_entries(k, v, *bad)


def test_compress_kv(rng):
    q, k, v = inputs(rng, B=1, N=4, M=40, H=2, Hkv=1, D=4, Dv=3)
    compressor = subquad.CompressKV(sink=4, window=4, compression_ratio=0.5, bin_rank=4)
    selection = compressor.select(k, v)
    keys, *_, lengths, _, _ = subquad.weighted_kv_entries(k, v, *selection)
    assert compressor.bins(40) >= 1
    assert 8 < lengths[0, 0] < 40
    np.testing.assert_array_equal(keys[0, 0, :4], k[0, :4, 0])
    out = entries_attend(q, k, v, selection)
    assert out.shape == (1, 4, 2, 3) and np.all(np.isfinite(out))
    # Keeping every middle point is exact up to the float32 round-off of the Nystrom
    # weights, which the conditioning of the kernel matrix of 32 keys amplifies.
    lossless = subquad.CompressKV(sink=4, window=4, compression_ratio=0.0, bin_rank=32)
    np.testing.assert_allclose(entries_attend(q, k, v, lossless.select(k, v)),
                               attention_reference(q, k, v), atol=1e-2)


def test_selections_name_the_tokens_their_entries_hold(rng):
    q, k, v = inputs(rng, B=2, N=3, M=60, H=4, Hkv=2, D=4, Dv=3)
    k[:, 31] = k[:, 30]  # two tokens share a key: only the index tells them apart
    compressor = subquad.CompressKV(sink=4, window=5, compression_ratio=0.5, bin_rank=4)
    selections = [compressor.select(k, v), subquad.streaming_llm_select(k, v, sink=2, window=3),
                  subquad.snapkv_select(q, k, v, capacity=9, pool_kernel=3)]
    for selection in selections:
        indices, values, weights, log_scales, counts = selection
        keys, held, held_log_scales, lengths, _, _ = subquad.weighted_kv_entries(k, v, *selection)
        assert indices.dtype == np.int64 and counts.shape == (2, 2)
        np.testing.assert_array_equal(lengths, counts)
        for b in range(2):
            for h in range(2):
                n = counts[b, h]
                assert (indices[b, h, n:] == -1).all()
                np.testing.assert_array_equal(k[b, indices[b, h, :n], h], keys[b, h, :n])
                np.testing.assert_array_equal(values[b, h, :n], held[b, h, :n, :-1])
                np.testing.assert_array_equal(weights[b, h, :n], held[b, h, :n, -1])
                np.testing.assert_array_equal(log_scales[b, h, :n], held_log_scales[b, h, :n])
    indices, counts = selections[0][0], selections[0][4]  # CompressKV's
    np.testing.assert_array_equal(indices[0, 0, :4], [0, 1, 2, 3])  # the sinks
    np.testing.assert_array_equal(indices[0, 0, counts[0, 0] - 5:counts[0, 0]], range(55, 60))


def test_streaming_llm_and_snapkv_selections(rng):
    q, k, v = inputs(rng, B=1, N=3, M=20, H=2, Hkv=1, D=4, Dv=2)
    indices, *_, counts = subquad.streaming_llm_select(k, v, sink=2, window=3)
    assert counts[0, 0] == 5
    np.testing.assert_array_equal(indices[0, 0], [0, 1, 17, 18, 19])
    indices, *_, counts = subquad.snapkv_select(q, k, v, capacity=8, pool_kernel=3)
    assert counts[0, 0] == 8
    np.testing.assert_array_equal(indices[0, 0, -3:], [17, 18, 19])
    everything = subquad.snapkv_select(q, k, v, capacity=64)
    np.testing.assert_allclose(entries_attend(q, k, v, everything), attention_reference(q, k, v),
                               atol=1e-5)


def test_bad_inputs(rng):
    q, k, v = inputs(rng)
    with pytest.raises(ValueError, match="float32"):
        subquad.wildcat_attention(q.astype(np.float64), k, v)
    with pytest.raises(ValueError, match="method"):
        subquad.wildcat_attention(q, k, v, method="rpc")
    with pytest.raises(ValueError, match="query_radius"):
        subquad.wildcat_attention(q, k, v, query_radius="max")
    with pytest.raises(ValueError):
        subquad.wildcat_attention(q, k, v, rank=0)
    with pytest.raises(ValueError):
        subquad.wildcat_attention(q, k, v[:, :3])
    with pytest.raises(ValueError, match="contiguous"):
        subquad.wildcat_attention(np.asfortranarray(q), k, v)
    with pytest.raises(ValueError):
        subquad.snapkv_select(q, k, v, pool_kernel=2)


def test_query_rows_with_any_stride(rng):
    """One query as a torch tensor (torch gives the size-1 N dimension stride 1 over
    DLPack: the layer at T = 1, a one-token padded row) and queries broadcast over N
    (stride 0) attend like the same queries stored contiguously; sgemm once refused their
    leading dimension ("oneDNN sgemm failed with status 2")."""
    torch = pytest.importorskip("torch")
    q, k, v = inputs(rng, B=1, N=4)
    one = subquad.wildcat_attention(q[:, :1].copy(), k, v, rank=8)
    out = subquad.wildcat_attention(torch.from_numpy(q[:, :1].copy()), torch.from_numpy(k),
                                    torch.from_numpy(v), rank=8)
    np.testing.assert_array_equal(np.asarray(out), one)
    assert np.isfinite(one).all() and np.abs(one).max() > 0
    broadcast = torch.from_numpy(q[:, :1].copy()).expand(1, 4, *q.shape[2:])
    repeated = np.repeat(q[:, :1], 4, axis=1)
    np.testing.assert_array_equal(
        np.asarray(subquad.wildcat_attention(broadcast, torch.from_numpy(k), torch.from_numpy(v),
                                             rank=8)),
        subquad.wildcat_attention(repeated, k, v, rank=8))


def test_the_layer_at_one_token():
    """The C++ path of the WildCat layer at T = 1 (its q is a [B, 1, H, D] torch tensor):
    the case that reached the sgemm refusal."""
    torch = pytest.importorskip("torch")
    from subquad.layers.wildcat import WildcatAttention

    torch.manual_seed(0)
    layer = WildcatAttention(32, 4, rank=8)
    x, context = torch.randn(2, 3, 32), torch.randn(2, 20, 32)
    with torch.no_grad():
        one = layer(x[:, :1], context=context)[0]
        again = layer(x[:, :1].clone(), context=context)[0]
    assert one.shape == (2, 1, 32) and torch.isfinite(one).all() and one.abs().max() > 0
    torch.testing.assert_close(one, again, rtol=0, atol=0)
