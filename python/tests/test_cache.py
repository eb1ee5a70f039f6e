"""subquad.cache.KVCache against full attention in float64 torch: prefill + decode equals
one causal pass (GQA, windows, the kernel path and the torch path), compression, roll back,
copies, bounded memory and argument errors."""

import math

import pytest
import torch

from subquad.cache import KVCache


def reference(q, k, v, window=None, log_weights=None):
    """Causal (bottom-right) softmax attention in float64; q [B,N,H,D], k/v [B,M,Hkv,*]."""
    batch, n, heads, dim = q.shape
    m, kv_heads = k.shape[1], k.shape[2]
    k = k.repeat_interleave(heads // kv_heads, dim=2).double()
    v = v.repeat_interleave(heads // kv_heads, dim=2).double()
    scores = torch.einsum("bnhd,bmhd->bhnm", q.double(), k) / math.sqrt(dim)
    if log_weights is not None:
        scores = scores + log_weights.repeat_interleave(heads // kv_heads, 1)[:, :, None, :]
    i = torch.arange(n)[:, None] + (m - n)
    j = torch.arange(m)[None, :]
    visible = j <= i
    if window is not None:
        visible &= j > i - window
    scores = scores.masked_fill(~visible, -math.inf)
    return torch.einsum("bhnm,bmhd->bnhd", torch.softmax(scores, -1), v)


def tokens(batch, n, heads, dim, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, n, heads, dim, generator=generator, dtype=dtype)


def tolerance(dtype):
    return 1e-12 if dtype == torch.float64 else 2e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("heads,kv_heads", [(3, 3), (6, 2), (4, 1)])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("chunks", [[13], [7, 1, 1, 1, 3], [1] * 9])
def test_prefill_then_decode_equals_one_causal_pass(dtype, heads, kv_heads, window, chunks):
    batch, dim, dv = 2, 7, 5
    n = sum(chunks)
    q = tokens(batch, n, heads, dim, dtype, 1)
    k = tokens(batch, n, kv_heads, dim, dtype, 2)
    v = tokens(batch, n, kv_heads, dv, dtype, 3)
    expected = reference(q, k, v, window=window)
    for use_kernel in (True, False):
        cache = KVCache(batch, kv_heads, dim, dv, window=window, dtype=dtype)
        outs, start = [], 0
        for size in chunks:
            part = slice(start, start + size)
            cache.append(k[:, part], v[:, part])
            outs.append(cache.attend(q[:, part]) if use_kernel else
                        cache._attend_torch(q[:, part], 1 / math.sqrt(dim)))
            start += size
        out = torch.cat(outs, dim=1)
        assert torch.isfinite(out).all() and out.abs().max() > 0
        assert (out.double() - expected).abs().max() < tolerance(dtype)
        assert cache.seen == n


def test_window_bounds_memory():
    cache = KVCache(1, 2, 4, window=8)
    for _ in range(100):
        x = tokens(1, 1, 2, 4, torch.float32, 0)
        cache.update(x, x, x)
    assert cache.length <= 9 and cache.seen == 100
    assert cache.nbytes <= 2 * 2 * 4 * 4 * 32  # keys + values at most a few windows


def test_compress_keeping_everything_changes_nothing_and_weights_shift_scores():
    batch, heads, kv_heads, dim, n = 2, 4, 2, 6, 11
    q, k, v = (tokens(batch, n, h, dim, torch.float64, s)
               for h, s in ((heads, 4), (kv_heads, 5), (kv_heads, 6)))
    cache = KVCache(batch, kv_heads, dim, dtype=torch.float64)
    cache.append(k[:, :10], v[:, :10])
    everything = torch.arange(10).expand(batch, kv_heads, 10).contiguous()
    log_weights = torch.linspace(-1, 1, 10, dtype=torch.float64).expand(batch, kv_heads, 10)
    cache.compress(everything, log_weights.contiguous())
    assert cache.compressed
    cache.append(k[:, 10:], v[:, 10:])
    out = cache.attend(q[:, 10:])
    full_weights = torch.cat([log_weights, torch.zeros(batch, kv_heads, 1,
                                                       dtype=torch.float64)], 2)
    expected = reference(q, k, v, log_weights=full_weights)[:, 10:]
    assert (out - expected).abs().max() < 1e-12


def test_compress_drops_bytes_and_keeps_original_positions():
    cache = KVCache(1, 3, 8, dtype=torch.float32)
    x = tokens(1, 40, 3, 8, torch.float32, 7)
    cache.append(x, x)
    before = cache.nbytes
    keep = torch.stack([torch.arange(0, 40, 4), torch.arange(30, 40), torch.arange(10)])[None]
    cache.compress(keep)
    assert cache.length == 10 and cache.nbytes < before / 2
    assert torch.equal(cache.positions[0, 1], torch.arange(30, 40))
    q = tokens(1, 1, 3, 8, torch.float32, 8)
    cache.append(q, q)  # position 40
    assert cache.positions[0, 0, -1] == 40
    out = cache.attend(q)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="compressed"):
        cache.truncate(20)


def test_storage_after_a_compression_grows_by_a_quarter_at_most():
    batch, kv_heads, dim = 1, 2, 4
    cache = KVCache(batch, kv_heads, dim, dtype=torch.float64)
    x = tokens(batch, 400, kv_heads, dim, torch.float64, 9)
    cache.append(x, x)
    keep = torch.arange(0, 400, 4).expand(batch, kv_heads, 100).contiguous()
    cache.compress(keep, torch.full((batch, kv_heads, 100), -0.5, dtype=torch.float64))
    assert cache.capacity == 100
    entry_bytes = kv_heads * (2 * dim * 8 + 8 + 8)  # key, value, position, log-weight
    for step in range(300):
        y = tokens(batch, 1, kv_heads, dim, torch.float64, 10 + step)
        cache.append(y, y)
        assert cache.capacity <= 1.25 * cache.length + 1, (step, cache.capacity)
        assert cache.nbytes == batch * cache.capacity * entry_bytes
    # The appended entries weigh 1 (log-weight 0); the kept ones keep theirs.
    assert (cache.log_weights[..., :100] == -0.5).all() and (cache.log_weights[..., 100:] == 0).all()
    assert torch.equal(cache.positions[0, 0, 100:], torch.arange(400, 700))
    # The log-weights are the keys' last column: one view, no copy per step.
    assert cache.keys_and_log_weights.shape == (batch, kv_heads, 400, dim + 1)
    assert cache.log_weights.data_ptr() == cache.keys_and_log_weights[..., dim].data_ptr()


def test_truncate_and_clone():
    q, k, v = (tokens(1, 12, 2, 4, torch.float64, s) for s in (1, 2, 3))
    cache = KVCache(1, 2, 4, dtype=torch.float64)
    cache.append(k[:, :8], v[:, :8])
    copy = cache.clone()
    cache.append(k[:, 8:], v[:, 8:])
    cache.truncate(8)
    assert cache.seen == 8 and copy.seen == 8
    for state in (cache, copy):
        state.append(k[:, 8:9], v[:, 8:9])
        out = state.attend(q[:, 8:9])
        assert (out - reference(q[:, :9], k[:, :9], v[:, :9])[:, 8:]).abs().max() < 1e-12


def test_masked_non_finite_values_do_not_reach_queries_that_cannot_see_them():
    q, k, v = (tokens(1, 6, 1, 4, torch.float64, s) for s in (1, 2, 3))
    v[:, 4] = math.nan
    k[:, 5] = math.inf
    cache = KVCache(1, 1, 4, dtype=torch.float64)
    cache.append(k, v)
    for out in (cache.attend(q), cache._attend_torch(q, 0.5)):
        assert torch.isfinite(out[:, :4]).all()
        assert torch.isnan(out[:, 4:]).all()


@pytest.mark.parametrize("call,message", [
    (lambda c: c.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 2, 4)), "k: expected shape"),
    (lambda c: c.append(torch.zeros(1, 2, 2, 4), torch.zeros(1, 3, 2, 4)), "v: expected 2"),
    (lambda c: c.attend(torch.zeros(1, 1, 3, 4)), "multiple of kv_heads"),
    (lambda c: c.attend(torch.zeros(1, 1, 2, 4)), "only 0 tokens"),
    (lambda c: c.append(torch.zeros(1, 1, 2, 4, dtype=torch.float64),
                        torch.zeros(1, 1, 2, 4, dtype=torch.float64)), "expected torch.float32"),
    (lambda c: c.truncate(-1), "length"),
    (lambda c: c.compress(torch.zeros(1, 2, 1)), "keep: expected int64"),
])
def test_bad_arguments_name_the_argument(call, message):
    cache = KVCache(1, 2, 4)
    with pytest.raises(ValueError, match=message):
        call(cache)


def test_bad_construction():
    with pytest.raises(ValueError, match="kv_heads"):
        KVCache(1, 0, 4)
    with pytest.raises(ValueError, match="window"):
        KVCache(1, 1, 4, window=0)


@pytest.mark.parametrize("compress", [False, True])
def test_more_queries_than_the_window_covers_are_refused(compress):
    """A window-bounded cache holds the last `window` keys before each append: queries
    older than the last append need keys it dropped, so it refuses rather than answer
    from what is left."""
    window, dim = 4, 3
    q, k, v = (tokens(1, 12, 1, dim, torch.float64, seed) for seed in (1, 2, 3))
    cache = KVCache(1, 1, dim, window=window, dtype=torch.float64)
    for t in range(10):  # one token at a time: position 9 is the last
        cache.append(k[:, t:t + 1], v[:, t:t + 1])
    if compress:  # a pressed cache (keys by position) as well
        cache.compress(torch.arange(cache.length)[None, None])
    # held: positions 5..9 (the window before the last append, and it); the last two
    # queries (8, 9) read 5..9, a third (7) would need position 4.
    expected = reference(q[:, :10], k[:, :10], v[:, :10], window=window)
    out = cache.attend(q[:, 8:10])
    assert torch.allclose(out, expected[:, 8:10], atol=1e-12)
    with pytest.raises(ValueError, match="covers the last 2 queries only"):
        cache.attend(q[:, 7:10])
    # A chunk appended at once is covered whole, however long.
    cache.append(k[:, 10:12], v[:, 10:12])
    out = cache.attend(q[:, 10:12])
    full = reference(q, k, v, window=window)
    assert torch.allclose(out, full[:, 10:12], atol=1e-12)
