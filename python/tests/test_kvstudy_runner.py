"""subquad.kvstudy's runner on a tiny random Llama: replaying a press's hooks on a recorded
prefill gives the cache of compressing during the prefill; a run killed after k cells and
rerun computes each cell once and gives the uninterrupted run's results; the report names
missing cells."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("kvpress")
pytest.importorskip("scipy")

from transformers import DynamicCache  # noqa: E402

from kvstudy_fixtures import TEXTS, CharTokenizer, config_data, tiny_model  # noqa: E402
from subquad.hf.coreset_cache import CoresetLayer  # noqa: E402
from subquad.kvstudy import runner as runner_module  # noqa: E402
from subquad.kvstudy.config import parse  # noqa: E402
from subquad.kvstudy.lm import continuation_logits  # noqa: E402
from subquad.kvstudy.presses import make  # noqa: E402
from subquad.kvstudy.replay import Prefill, decoder_layers  # noqa: E402
from subquad.kvstudy.report import render  # noqa: E402
from subquad.kvstudy.runner import Runner  # noqa: E402
from subquad.kvstudy.store import Store, cell_key  # noqa: E402

# Fields that must repeat exactly; the rest are times, loads and memory.
RESULTS = ("delta_nll", "kl", "top1", "key_delta_nll", "key_kl", "key_tokens", "full_nll",
           "short_nll", "score", "answer", "entries_held", "entries_attended", "cache_bytes")

REPLAYED = [("snapkv", {"window_size": 8}), ("adakv_snapkv", {"window_size": 8}),
            ("pyramidkv", {"window_size": 4, "beta": 2}), ("tova", {}),
            ("expected_attention", {"n_future_positions": 16}), ("keydiff", {}),
            ("streaming_llm", {}), ("knorm", {}), ("random", {}),
            ("uniform_baseline", {"n_sink": 2, "window_size": 4}),
            ("compresskv", {"n_sink": 2, "window_size": 4, "bin_rank": 4}),
            ("uniform_nystrom", {"n_sink": 2, "window_size": 4, "bin_rank": 4})]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("name,settings", REPLAYED)
def test_replayed_compression_equals_compression_in_the_prefill(model, name, settings):
    ids = torch.tensor([CharTokenizer().tokenize(TEXTS["persuasion"][:64])])
    prefill = Prefill(model, ids[:, :48])
    replayed, cost = prefill.compress(make(name, 0.6, 3, settings))
    replayed_masks = [m.masked_key_indices for m in prefill.modules]
    direct = DynamicCache()
    press = make(name, 0.6, 3, settings)
    with torch.no_grad(), press(model):
        model(input_ids=ids[:, :48], past_key_values=direct)
    direct_masks = [layer.self_attn.masked_key_indices for layer in decoder_layers(model)]
    for a, b in zip(replayed.layers, direct.layers):
        assert type(a) is type(b)
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        if isinstance(a, CoresetLayer):
            assert torch.equal(a.log_weights, b.log_weights)
    for a, b in zip(replayed_masks, direct_masks):
        assert (a is None) == (b is None)
        if a is not None:
            assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert replayed.layers[0].keys.shape[2] < 48 or name == "adakv_snapkv"
    # The continuation reads AdaKV's masks from the modules: the direct run's are set now.
    direct_logits = continuation_logits(model, direct, prefill.last_logits, ids[0, 48:], 48, 4)
    for module, masks in zip(prefill.modules, replayed_masks):
        module.masked_key_indices = masks
    replayed_logits = continuation_logits(model, replayed, prefill.last_logits, ids[0, 48:], 48, 4)
    assert torch.equal(replayed_logits, direct_logits)
    assert cost["compress_cpu_s"] >= 0


def _run(out, model, max_new_cells=None, share=(0, 1), log=lambda m: None, tasks=None):
    data = config_data(str(out))
    data["tasks"].update(tasks or {})
    config = parse(data)
    runner = Runner(config, model, CharTokenizer(), texts=TEXTS, log=log)
    return config, runner.run(max_new_cells, share)


def _cells(out):
    return {cell_key(r): r for r in Store(str(out)).records if r["type"] == "cell"}


@pytest.fixture(scope="module")
def uninterrupted(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    config, computed = _run(out, model)
    return out, computed


def test_a_killed_run_resumes_without_recomputing(model, tmp_path, uninterrupted,
                                                  monkeypatch):
    whole, total = uninterrupted
    assert total == len(_cells(whole)) > 20
    assert _run(tmp_path, model, max_new_cells=7)[1] == 7
    assert len(_cells(tmp_path)) == 7
    with open(os.path.join(tmp_path, "cells.jsonl"), "a") as handle:
        handle.write('{"type": "cell", "phase": "evaluate", "ta')  # killed mid-write
    assert _run(tmp_path, model, max_new_cells=30)[1] == 30
    assert _run(tmp_path, model)[1] == total - 37
    lines = [json.loads(line) for line in open(os.path.join(tmp_path, "cells.jsonl"))
             if line.strip().endswith("}")]
    keys = [cell_key(r) for r in lines if r["type"] == "cell"]
    assert len(keys) == len(set(keys)) == total  # no cell computed twice
    resumed, reference = _cells(tmp_path), _cells(whole)
    assert resumed.keys() == reference.keys()
    for key, record in reference.items():
        for field in RESULTS:
            assert resumed[key].get(field) == record.get(field), (key, field)

    # Everything recorded: nothing is prefilled again.
    def refuse(*args, **kwargs):
        raise AssertionError("a finished document was prefilled")

    monkeypatch.setattr(runner_module, "Prefill", refuse)
    assert _run(tmp_path, model)[1] == 0


def test_shares_split_the_cells_between_processes(model, tmp_path, uninterrupted):
    whole, total = uninterrupted
    said = []
    # The tuning document is share 0's: share 1 waits for it, computing nothing.
    assert _run(tmp_path, model, share=(1, 2), log=said.append)[1] == 0
    assert any("tuning cells of the other shares are missing" in m for m in said)
    first = _run(tmp_path, model, share=(0, 2))[1]
    second = _run(tmp_path, model, share=(1, 2))[1]
    assert 0 < second < first < total and first + second == total
    assert _run(tmp_path, model, share=(0, 2))[1] == _run(tmp_path, model, share=(1, 2))[1] == 0
    shared, reference = _cells(tmp_path), _cells(whole)
    assert shared.keys() == reference.keys()
    for key, record in reference.items():
        for field in RESULTS:
            assert shared[key].get(field) == record.get(field), (key, field)
    sessions = [r["share"] for r in Store(str(tmp_path)).records if r["type"] == "session"]
    assert sessions == ["1/2", "0/2", "1/2", "0/2", "1/2"]
    with pytest.raises(ValueError, match="share"):
        _run(tmp_path, model, share=(2, 2))


@pytest.mark.parametrize("text", ["2/2", "-1/2", "0/0", "1", "a/b", "0/65"])
def test_the_cli_refuses_a_bad_share(text, capsys):
    from subquad.kvstudy.__main__ import main

    with pytest.raises(SystemExit):
        main(["run", "unused.toml", f"--share={text}"])
    assert "--share: expected K/N with 0 <= K < N <= 64" in capsys.readouterr().err


def _task_cells(out, press=None):
    return {(r["task"], r["document"]) for r in _cells(out).values()
            if r["task"] != "lm" and (press is None or (r["press"] == "full") == (press == "full"))}


def test_presses_run_only_in_calibrated_groups(model, tmp_path, monkeypatch):
    # The tiny model answers nothing: score the answers by seed instead. niah's seeds all
    # "answer", vartrack's seed 1 does not, so vartrack is not calibrated.
    def score(task, text):
        return float(task.kind == "niah" or task.seed == 0)

    monkeypatch.setattr(runner_module, "score_answer", score)
    prefills = []

    class CountedPrefill(runner_module.Prefill):
        def __init__(self, model, ids):
            prefills.append(ids.shape[1])
            super().__init__(model, ids)

    monkeypatch.setattr(runner_module, "Prefill", CountedPrefill)
    tasks = {"seeds": [0, 1], "skip_on_miss": True}
    config, _ = _run(tmp_path, model, tasks=tasks)
    full = _task_cells(tmp_path, "full")
    pressed = _task_cells(tmp_path, "press")
    assert full == {(kind, f"gcide/96/{depth}/{seed}") for kind, depth in
                    (("niah", 0.5), ("vartrack", None)) for seed in (0, 1)}
    # vartrack's seed 0 answers, but its group is not calibrated: no press runs on it.
    assert pressed == {("niah", "gcide/96/0.5/0"), ("niah", "gcide/96/0.5/1")}
    store = Store(str(tmp_path))
    assert runner_module.calibrated(config, store, "vartrack", "gcide", 96, None) is False
    assert runner_module.calibrated(config, store, "niah", "gcide", 96, 0.5) is True
    # Documents: one prefill each; tasks: one per instance, and one again for niah's seed 0
    # (seed 1, the last calibrated, keeps its own).
    documents = len(config.documents("tune")) + len(config.documents("evaluate"))
    task_prefills = [n for n in prefills if n != config.lm.context]
    assert len(prefills) - len(task_prefills) == documents and len(task_prefills) == 4 + 1
    page = render(config, store)
    assert "**0 missing**" in page  # no press cell is expected on vartrack's seed 0
    assert "| vartrack | gcide | 96 | random | 0.50 | 2 | no |" in page


def test_a_prefill_done_again_answers_as_the_first(model, tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "score_answer", lambda task, text: 1.0)
    _run(tmp_path / "one", model, tasks={"seeds": [0], "skip_on_miss": True})
    _run(tmp_path / "two", model, tasks={"seeds": [0, 1], "skip_on_miss": True})
    one, two = _cells(tmp_path / "one"), _cells(tmp_path / "two")
    # Seed 0 of the two-seed groups is prefilled again for its presses; alone, it is not.
    seed0 = [key for key, r in one.items() if r["task"] != "lm" and r["press"] != "full"]
    assert len(seed0) > 10
    for key in seed0:
        for field in RESULTS:
            assert two[key].get(field) == one[key].get(field), (key, field)


def test_the_report_marks_missing_cells(model, tmp_path, uninterrupted):
    whole, _ = uninterrupted
    config = parse(config_data(str(tmp_path)))
    _run(tmp_path, model, max_new_cells=5)
    partial = render(config, Store(str(tmp_path)))
    assert "Not chosen yet: tuning cells are missing" in partial
    assert "| tune | lm | knorm | 0.5 | 1 |" in partial
    # A whole run with one evaluation cell taken out.
    records = [json.loads(line) for line in open(os.path.join(whole, "cells.jsonl"))]
    dropped = [r for r in records if r.get("phase") == "evaluate" and r.get("task") == "lm"
               and r.get("press") == "knorm" and r.get("ratio") == 0.75
               and r.get("document") == "mobydick/1"]
    assert len(dropped) == 1
    os.remove(os.path.join(tmp_path, "cells.jsonl"))
    with open(os.path.join(tmp_path, "cells.jsonl"), "w") as handle:
        for r in records:
            if r is not dropped[0]:
                handle.write(json.dumps(r) + "\n")
    page = render(config, Store(str(tmp_path)))
    assert "**1 missing**" in page
    assert "| evaluate | lm | knorm | 0.75 | 1 |" in page
    delta_nll_table = page.split("`delta_nll`:")[1].split("`kl`:")[0]
    knorm_row = [line for line in delta_nll_table.splitlines() if line.startswith("| knorm")]
    assert knorm_row[0].endswith("(3/4) |")
    assert "pilot: no verdict" in page
    verdicts = page.split("### The primary comparison")[1].split("### Retrieval")[0]
    assert "reproduced" not in verdicts and "contradicted" not in verdicts
