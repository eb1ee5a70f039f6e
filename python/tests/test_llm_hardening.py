"""subquad.llm's API under the cases of issue 29 that the command line reaches
(test_llm_cli_hostile.py drives the command): the model never runs past
llama.context_length, and passkey depths are fractions."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import tiny_gguf  # noqa: E402
from subquad.llm import evaluation, load  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load(str(tiny_gguf.write(tmp_path_factory.mktemp("gguf") / "tiny.gguf")))


# ---- context length (llama.context_length = 512 in the tiny model) ----

def test_no_forward_runs_past_the_context_length(tiny):
    ids = torch.zeros(1, 513, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"positions 0 .. 512: the model has 512"):
        tiny.logits(ids)
    assert tiny.logits(ids[:, :512]).shape[1] == 512  # the last position is the model's
    cache = tiny.new_cache(1)
    tiny.prefill(ids[:, :500], cache)
    tiny.step(ids[:, :12], cache)
    with pytest.raises(ValueError, match=r"positions 512 .. 512"):
        tiny.step(ids[:, :1], cache)
    assert cache.seen == 512  # the refused step appended nothing
    with pytest.raises(ValueError, match=r"n_ctx: 600 is more than the model's context length"):
        evaluation.sliding_perplexity(tiny, list(range(1200)), 600)


def test_generate_refuses_before_the_first_token(tmp_path):
    model = load(str(tiny_gguf.write(tmp_path / "short.gguf", context_length=1)))
    seen = []
    with pytest.raises(ValueError, match=r"positions 0 .. 1: the model has 1"):
        model.generate([5], 2, on_token=seen.append)
    assert seen == []
    assert len(model.generate([5], 1)) == 1  # one position: a prompt token and one answer
    with pytest.raises(ValueError, match="prompt_ids: expected at least one token"):
        model.generate([], 1)


def test_passkey_case_checks_depth_and_length(tiny):
    for depth in (-1, 2, float("nan")):
        with pytest.raises(ValueError, match="depth: expected a fraction"):
            evaluation.passkey_case(tiny, 300, depth, 0, [], [])
    with pytest.raises(ValueError, match="length: a prompt of 510 tokens and a 8-token answer"):
        evaluation.passkey_case(tiny, 510, 0.5, 0, [], [])
    shortest = evaluation.passkey_min_length(tiny)
    assert len(evaluation.passkey_prompt(tiny, shortest, 0.5, 12345)) + len(
        tiny.tokenize(evaluation.PASSKEY_QUESTION)) == shortest
    with pytest.raises(ValueError, match="cannot hold the template"):
        evaluation.passkey_prompt(tiny, shortest - 1, 0.5, 12345)


def test_peak_memory_counts_a_phase_that_reuses_freed_memory():
    """A phase that allocates what an earlier phase freed still shows its own growth (the
    allocator's free memory is returned first), and a phase that allocates nothing shows
    none of an earlier one's."""
    from subquad.llm.timing import PeakMemory

    def phase():
        return [torch.ones(100, 100) for _ in range(500)]  # 500 x 40 KB, from the heap

    earlier = phase()
    pin = torch.ones(100, 100)  # above the freed blocks: the heap's top cannot shrink
    del earlier
    with PeakMemory() as reused:
        held = phase()
    if reused.mib is None:
        pytest.skip("the high-water mark cannot be reset here")
    assert reused.mib > 10, reused.mib  # about 19 MiB
    del held, pin
    with PeakMemory() as idle:
        pass
    assert idle.mib < 2, idle.mib
