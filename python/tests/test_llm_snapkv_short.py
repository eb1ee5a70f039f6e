"""SnapKV on prompts no longer than its 64-query observation window (every prompt of
`generate --chat Hi --press snapkv` once failed): the budget is kept, the entries kept are
those the window's queries vote for, and decoding goes on."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import tiny_gguf  # noqa: E402
from subquad.llm import load  # noqa: E402
from subquad.llm.presses import make_press  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load(str(tiny_gguf.write(tmp_path_factory.mktemp("gguf") / "tiny.gguf")))


@pytest.mark.parametrize("length", [1, 2, 10, 63, 64, 65])
def test_snapkv_on_prompts_around_its_window(tiny, length):
    ids = torch.arange(length)[None] % 200 + 3
    cache = tiny.new_cache(1)
    tiny.prefill(ids, cache)
    make_press("snapkv", 0.5)(cache)
    assert cache.lengths == [length // 2] * tiny.config.blocks
    logits = tiny.step(torch.tensor([[7]]), cache)
    assert torch.isfinite(logits).all()


def test_snapkv_keeps_what_the_window_attends_to_on_a_short_prompt(tiny):
    """Keys the window's queries attend to most are the ones kept: the kept entries'
    votes are the largest (a press that dropped them would score worse)."""
    ids = torch.arange(20)[None] + 40
    cache = tiny.new_cache(1)
    tiny.prefill(ids, cache)
    press = make_press("snapkv", 0.75)
    scores = press.score(0, cache.layers[0], cache.queries[0])  # [B, Hkv, S]
    assert scores.shape == (1, tiny.config.kv_heads, 20) and torch.isfinite(scores).all()
    assert float(scores.std()) > 0  # not all tied
    press(cache)
    kept = cache.layers[0].positions[0]  # [Hkv, 5]
    for head in range(tiny.config.kv_heads):
        top = set(scores[0, head].topk(5).indices.tolist())
        assert set(kept[head].tolist()) == top
