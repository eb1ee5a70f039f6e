"""subquad.llm's llama forward and presses on a tiny random-weight model (from a tiny GGUF)."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import tiny_gguf  # noqa: E402
from subquad.llm import LlamaModel, read_gguf  # noqa: E402
from subquad.llm.presses import PRESSES, kept_entries, make_press  # noqa: E402


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    # 2048 positions: the press tests prefill 1200 tokens (the model refuses more than its
    # llama.context_length)
    return read_gguf(str(tiny_gguf.write(tmp_path_factory.mktemp("gguf") / "tiny.gguf",
                                         context_length=2048)))


@pytest.fixture(scope="module")
def model64(tiny_file):
    return LlamaModel.from_gguf(tiny_file, dtype=torch.float64)


def _ids(count, batch=1, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, tiny_gguf.tensors()["token_embd.weight"].shape[0], (batch, count),
                         generator=generator)


def test_prefill_and_steps_equal_the_full_forward(model64):
    ids = _ids(97, batch=2)
    full = model64.logits(ids)  # [2, 97, V]
    assert full.shape == (2, 97, model64.config.vocab) and torch.isfinite(full).all()
    assert full.abs().max() > 0
    cache = model64.new_cache(2)
    pieces = [model64.prefill(ids[:, :60], cache, all_logits=True)]
    pieces += [model64.step(ids[:, t:t + 1], cache) for t in range(60, 90)]
    pieces.append(model64.step(ids[:, 90:], cache))  # a chunk of 7 after single steps
    decoded = torch.cat(pieces, dim=1)
    assert cache.seen == 97 and cache.lengths == [97] * model64.config.blocks
    torch.testing.assert_close(decoded, full, rtol=0, atol=1e-10)


def test_step_each_equals_each_cache_stepped_alone(model64):
    # One prompt under three presses: caches of different lengths, with and without
    # log-weights (200 tokens at r = 0.5 leave room for bins, at r = 0.75 not), decoded as
    # one batch.
    prefilled = _prefilled(model64, 200)
    caches = [prefilled.clone()]
    for name, ratio in [("nystrom", 0.5), ("compresskv", 0.75)]:
        caches.append(prefilled.clone())
        make_press(name, ratio, 0)(caches[-1])
    assert [c.layers[0].log_weights is not None for c in caches] == [False, True, False]
    alone = [c.clone() for c in caches]
    ids = _ids(9 * len(caches), seed=1).view(len(caches), 9)
    for chunk in (slice(0, 5), slice(5, 6), slice(6, 9)):
        batched = model64.step_each(ids[:, chunk], caches)
        expected = torch.cat([model64.step(ids[i:i + 1, chunk], c) for i, c in enumerate(alone)])
        torch.testing.assert_close(batched, expected, rtol=0, atol=1e-10)
    assert [c.lengths for c in caches] == [c.lengths for c in alone]
    assert len({c.lengths[0] for c in caches}) == 3  # the rows really differ
    with pytest.raises(ValueError, match="caches: expected 2 caches of batch 1"):
        model64.step_each(ids[:2, :1], caches)
    with pytest.raises(ValueError, match="caches: expected distinct caches"):
        model64.step_each(ids[:2, :1], [caches[0], caches[0]])
    with pytest.raises(ValueError, match="caches: expected caches that have seen the same"):
        model64.step_each(ids[:2, :1], [caches[0], _prefilled(model64, 50)])


def test_float32_agrees_with_float64(tiny_file, model64):
    model32 = LlamaModel.from_gguf(tiny_file, dtype=torch.float32)
    ids = _ids(64)
    reference = model64.logits(ids)
    error = (model32.logits(ids).double() - reference).abs().max()
    # float32 round-off through 2 blocks: a few hundred ulps of the logits' scale
    assert 0 < error < 1e-4 * max(1.0, float(reference.abs().max()))


def test_rope_rotates_adjacent_pairs(model64):
    # A rotation by position p of pair (x0, x1) at frequency 1 (the first pair).
    x = torch.zeros(1, 1, 1, model64.config.head_dim, dtype=torch.float64)
    x[..., 0] = 1.0
    rotated = model64._rope(x, 3)
    assert math.isclose(float(rotated[..., 0]), math.cos(3.0), abs_tol=1e-12)
    assert math.isclose(float(rotated[..., 1]), math.sin(3.0), abs_tol=1e-12)
    assert float(rotated[..., 2:].abs().max()) == 0.0


def _prefilled(model, length, seed=0):
    cache = model.new_cache(1)
    model.prefill(_ids(length, seed=seed), cache)
    return cache


@pytest.mark.parametrize("name", sorted(PRESSES))
@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 0.875])
def test_press_keeps_the_stated_count_per_head(model64, name, ratio):
    length = 300
    cache = _prefilled(model64, length)
    full_bytes = cache.nbytes
    press = make_press(name, ratio)
    press(cache)
    want = length if (ratio == 0.0 or name == "none") else kept_entries(length, ratio)
    for layer in cache.layers:
        assert layer.length == want
        assert layer.keys.shape == (1, model64.config.kv_heads, want, model64.config.head_dim)
        positions = layer.positions
        assert positions.unique(dim=-1).shape[-1] == want or name in ("compresskv", "nystrom")
        assert int(positions.max()) < length
    if want < length:
        assert cache.nbytes < full_bytes  # the bytes really drop
    # A continuation keeps the original positions: the next token is at position 300.
    logits = model64.step(_ids(5, seed=1), cache)
    assert cache.seen == length + 5 and torch.isfinite(logits).all()


def test_ratio_zero_gives_the_full_cache(model64):
    ids = _ids(120)
    reference = _prefilled(model64, 120)
    expected = model64.step(ids[:, :9], reference.clone())
    for name in PRESSES:
        cache = reference.clone()
        make_press(name, 0.0)(cache)
        torch.testing.assert_close(model64.step(ids[:, :9], cache), expected, rtol=0, atol=0)


def _keep_uniform_subset(cache, kept, seed):
    """The unweighted baseline (kvpress's RandomPress): each KV head keeps `kept` entries
    drawn uniformly without replacement."""
    generator = torch.Generator().manual_seed(seed)
    for layer in cache.layers:
        batch, kv_heads = layer.keys.shape[:2]
        keep = torch.stack([torch.randperm(layer.length, generator=generator)[:kept].sort().values
                            for _ in range(batch * kv_heads)])
        layer.compress(keep.view(batch, kv_heads, kept))


def test_weighted_presses_carry_log_weights_and_beat_random(model64):
    # At 1200 tokens and r = 0.5 both weighted presses fill bins of 16 coreset points.
    length, ratio = 1200, 0.5
    ids = _ids(length + 32, seed=3)
    cache = model64.new_cache(1)
    model64.prefill(ids[:, :length], cache)
    reference = model64.step(ids[:, length:], cache.clone())
    random = cache.clone()
    _keep_uniform_subset(random, kept_entries(length, ratio), seed=1)
    errors = {"random": float((model64.step(ids[:, length:], random) - reference).abs().max())}
    for name in ("nystrom", "compresskv"):
        pressed = cache.clone()
        press = make_press(name, ratio, seed=1)
        press(pressed)
        assert pressed.layers[0].log_weights is not None
        assert press.stats["entries"] == model64.config.blocks * 2 * kept_entries(length, ratio)
        errors[name] = float((model64.step(ids[:, length:], pressed) - reference).abs().max())
    assert errors["compresskv"] < errors["random"] and errors["nystrom"] < errors["random"]


def test_bad_arguments_are_named(model64):
    with pytest.raises(ValueError, match="compression_ratio"):
        make_press("compresskv", 1.0)
    with pytest.raises(ValueError, match="press"):
        make_press("h2o", 0.5)
    with pytest.raises(ValueError, match="press: snapkv: retired; use kvpress's SnapKVPress"):
        make_press("snapkv", 0.5)
    with pytest.raises(ValueError, match="ids"):
        model64.logits(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="ids"):
        model64.logits(torch.full((1, 2), 10**6, dtype=torch.int64))
    cache = _prefilled(model64, 20)
    keep = torch.arange(5).expand(1, model64.config.kv_heads, 5).contiguous()
    with pytest.raises(ValueError, match="values: expected shape"):
        cache.layers[0].compress(keep, values=torch.zeros(1, model64.config.kv_heads, 4, 8,
                                                          dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_pressed_cache_attention_matches_the_masked_torch_path(dtype):
    from subquad.cache import KVCache
    from subquad.llm.pressed_cache import PressedKVCache

    generator = torch.Generator().manual_seed(5)
    batch, kv_heads, heads, dim, length = 2, 3, 9, 16, 101

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)

    fast = PressedKVCache(batch, kv_heads, dim, dtype=dtype)
    fast.append(randn(batch, length, kv_heads, dim), randn(batch, length, kv_heads, dim))
    keep = torch.stack([torch.randperm(length, generator=generator)[:37]
                        for _ in range(batch * kv_heads)]).view(batch, kv_heads, 37)
    log_weights = randn(batch, kv_heads, 37)
    log_weights[0, 1, 5] = -math.inf  # a dropped coreset point
    fast.compress(keep, log_weights=log_weights, values=randn(batch, kv_heads, 37, dim))
    slow = fast.clone()
    slow.__class__ = KVCache  # the same state through KVCache's masked torch attention
    for tokens in (7, 1, 3):  # a question, then single decode steps, then a chunk
        k, v, q = (randn(batch, tokens, kv_heads, dim), randn(batch, tokens, kv_heads, dim),
                   randn(batch, tokens, heads, dim))
        got, want = fast.update(q, k, v), slow.update(q, k, v)
        assert torch.isfinite(got).all() and got.abs().max() > 0
        tolerance = 1e-12 if dtype == torch.float64 else 2e-6
        torch.testing.assert_close(got, want, rtol=0, atol=tolerance)
    assert isinstance(fast.clone(), PressedKVCache)
    # A non-finite value appended later takes KVCache's path, in this cache and its clones.
    v = randn(batch, 1, kv_heads, dim)
    v[1, 0, 2, 3] = math.inf
    k, q = randn(batch, 1, kv_heads, dim), randn(batch, 1, heads, dim)
    got, want = fast.update(q, k, v), slow.update(q, k, v)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert not torch.isfinite(got[1]).all() and torch.isfinite(got[0]).all()
    k, v, q = (randn(batch, 1, kv_heads, dim), randn(batch, 1, kv_heads, dim),
               randn(batch, 1, heads, dim))
    torch.testing.assert_close(fast.clone().update(q, k, v), slow.update(q, k, v), rtol=0,
                               atol=0, equal_nan=True)
    # compress: non-finite kept values keep KVCache's path; dropping them restores the fast one.
    bad_values = randn(batch, kv_heads, fast.length - 2, dim)
    bad_values[0, 0, 0, 0] = math.nan  # entry 0; the second compress drops it
    for first, values, finite in [(0, bad_values, False), (1, None, True)]:
        keep = torch.arange(first, first + fast.length - 2).expand(batch, kv_heads, -1)
        fast.compress(keep.contiguous(), values=values)
        slow = fast.clone()
        slow.__class__ = KVCache
        k, v, q = (randn(batch, 1, kv_heads, dim), randn(batch, 1, kv_heads, dim),
                   randn(batch, 1, heads, dim))
        torch.testing.assert_close(fast.update(q, k, v), slow.update(q, k, v), rtol=0,
                                   atol=0 if not finite else tolerance, equal_nan=True)
        assert fast._values_finite == finite


def test_attention_workload_captures_what_attention_sees(model64):
    import numpy as np

    from subquad.llm.attention_workload import approximation_errors, capture_qkv

    ids = _ids(80)[0].tolist()
    captured = capture_qkv(model64, ids, [1])
    c = model64.config
    assert captured[1]["q"].shape == (1, 80, c.heads, c.head_dim)
    cache = model64.new_cache(1)
    model64.prefill(torch.tensor([ids]), cache)
    np.testing.assert_allclose(captured[1]["k"], cache.layers[1].keys.transpose(1, 2).numpy(),
                               rtol=1e-6, atol=1e-6)
    rows = approximation_errors(captured, [80, 8], seeds=(0,))
    by = {(r["method"], r["rank"]): r["rel_error"] for r in rows}
    assert by[("wildcat", 80)] < 1e-4  # every key kept: exact attention
    assert by[("uniform_subsample", 8)] > 1e-3


def test_captured_workload_round_trips_in_the_bench_layout(model64, tmp_path, monkeypatch):
    import json

    import numpy as np

    from subquad.llm.attention_workload import (capture_qkv, default_workload_dir,
                                                load_workload, save_workload)

    captured = capture_qkv(model64, _ids(40)[0].tolist(), [1, 0])
    save_workload(captured, str(tmp_path), {"text": "random ids"})
    c = model64.config
    q, k = np.load(tmp_path / "q.npy"), np.load(tmp_path / "k.npy")
    # What `subquad bench --inputs smollm2` reads: blocks on the batch axis, in block order.
    assert q.dtype == np.float32 and q.shape == (2, 40, c.heads, c.head_dim)
    assert k.shape == (2, 40, c.kv_heads, c.head_dim)
    np.testing.assert_array_equal(k[1], captured[1]["k"][0].astype(np.float32))
    assert json.loads((tmp_path / "workload.json").read_text())["blocks"] == [0, 1]
    assert not list(tmp_path.glob("*.partial"))
    back = load_workload(str(tmp_path))
    for block in (0, 1):
        for name in ("q", "k", "v"):
            np.testing.assert_array_equal(back[block][name], captured[block][name].astype(np.float32))
    with pytest.raises(ValueError, match="captured"):
        save_workload({}, str(tmp_path / "empty"))
    monkeypatch.setenv("SUBQUAD_WORKLOAD_DIR", str(tmp_path))
    assert default_workload_dir() == str(tmp_path)
    monkeypatch.delenv("SUBQUAD_WORKLOAD_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert default_workload_dir() == "/somewhere/subquad/smollm2"


def test_passkey_skips_presses_only_where_the_full_cache_misses(tiny_file, monkeypatch):
    from subquad.llm import GgufTokenizer, evaluation

    model64 = LlamaModel.from_gguf(tiny_file, GgufTokenizer(tiny_file.metadata),
                                   dtype=torch.float64)

    # A random-weight model never finds the key: with the flag no press runs ...
    record = evaluation.passkey_case(model64, 300, 0.5, 0, ["compresskv"], [0.5],
                                     answer_tokens=2, skip_presses_on_miss=True)
    assert not record["full_correct"] and record["presses_skipped"] and record["runs"] == []
    # ... without it every press runs; and a prompt the full cache gets right runs them too.
    record = evaluation.passkey_case(model64, 300, 0.5, 0, ["compresskv"], [0.5],
                                     answer_tokens=2)
    assert [r["press"] for r in record["runs"]] == ["compresskv"]
    assert "presses_skipped" not in record
    key = record["key"]
    monkeypatch.setattr(model64, "detokenize", lambda ids, **_: f" {key}.")
    record = evaluation.passkey_case(model64, 300, 0.5, 0, ["compresskv"], [0.5],
                                     answer_tokens=2, skip_presses_on_miss=True)
    assert record["full_correct"] and len(record["runs"]) == 1 and record["runs"][0]["correct"]


def test_timing_reports_each_press(model64):
    from subquad.llm.timing import time_presses

    result = time_presses(model64, _ids(200)[0].tolist(), ["none", "nystrom", "compresskv"], 0.5,
                          decode=3)
    assert result["prefill_s"] > 0 and result["full_cache_bytes"] > 0
    # CPU seconds exceed wall seconds when torch runs more threads: only the sign is checked
    assert result["prefill_cpu_s"] > 0
    by = {p["press"]: p for p in result["presses"]}
    assert by["none"]["cache_bytes_after_compress"] == result["full_cache_bytes"]
    assert by["nystrom"]["cache_bytes_after_compress"] < result["full_cache_bytes"]
    for p in by.values():
        assert p["decode_s"] > 0 and p["decode_cpu_ms_per_token"] > 0
        assert p["cache_bytes_after_decode"] >= p[
            "cache_bytes_after_compress"]
        # the high-water mark above the phase's start; freed pages can make it dip a hair
        assert p["decode_peak_mib"] is None or p["decode_peak_mib"] > -1.0


def test_compresskv_press_keeps_the_tokens_compresskv_selects_even_with_equal_keys():
    # Two tokens with the same key and different values: the press must keep the token
    # CompressKV picked (by index), not another one with its key.
    from subquad import _core
    from subquad.cache import KVCache
    from subquad.kv_coresets import BIN_RANK, layout
    from subquad.llm.presses import CompressKVPress

    torch.manual_seed(4)
    length, ratio = 400, 0.5
    k, v = torch.randn(1, length, 2, 8), torch.randn(1, length, 2, 4)
    k[:, 101::2] = k[:, 100:-1:2]  # every odd token past 100 repeats its even neighbour's key
    cache = KVCache(1, 2, 8, 4)
    cache.append(k, v)
    CompressKVPress(ratio, seed=2).compress_layer(0, cache)
    sinks, window, bins = layout(length, ratio)
    middle = length - sinks - window
    compressor = _core.CompressKV(sink=sinks, window=window,
                                  compression_ratio=1.0 - (bins * BIN_RANK + 0.5) / middle,
                                  bin_rank=BIN_RANK, seed=2 * 1000003)
    indices, _, weights, _, counts = compressor.select(k.numpy(), v.numpy(), threads=1)
    for h in range(2):
        n = int(counts[0, h])
        assert torch.equal(cache.positions[0, h, :n], torch.from_numpy(indices[0, h, :n]))
        assert ((torch.from_numpy(indices[0, h, :n]) % 2 == 1)
                & (torch.from_numpy(indices[0, h, :n]) > 100)).any()  # a repeated key kept
