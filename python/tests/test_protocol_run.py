"""A tiny experiment run end to end by the evidence protocol: the sweep on the tuning seed,
the reported seeds at the chosen rate with log-spaced evaluations, the test split and the
convergence test in every result, a second run that skips what is finished, the results
page with its verdicts, and committed model-only checkpoints that subquad-train
--evaluate scores to the same test figures."""

import json
import os

import pytest

pytest.importorskip("torch")
from subquad.data import austen  # noqa: E402
from subquad.experiments import protocol, protocol_report, report, run  # noqa: E402
from subquad.experiments.spec import load_experiment  # noqa: E402
from subquad.train import cli  # noqa: E402

from test_protocol import write  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(austen.DIRECTORY),
                                reason="r-cran-janeaustenr missing (scripts/install.sh)")
ANCHORS = {"byte 4-gram": {"validation": {"perplexity": 1e9}, "test": {"perplexity": 1e9}},
           "byte unigram": {"validation": {"perplexity": 2e9}, "test": {"perplexity": 2e9}}}


@pytest.fixture
def fake_anchors(monkeypatch):
    """Anchors every tiny model beats (the real n-gram counts are tested in test_anchors)."""
    monkeypatch.setattr(run, "experiment_anchors", lambda experiment: ANCHORS)
    monkeypatch.setattr(protocol, "experiment_anchors", lambda experiment: ANCHORS)


def test_a_protocol_experiment_runs_reports_and_reevaluates(tmp_path, fake_anchors, capsys):
    path = write(tmp_path)
    out_root = str(tmp_path / "runs")
    assert run.main([path, "--out-root", out_root]) == 0
    experiment = load_experiment(path, out_root)
    printed = capsys.readouterr().out
    assert printed.count("sweep lr x") >= 6 and "seed 2" in printed
    for variant in ("attention", "cat"):
        state = protocol.sweep_state(experiment, variant)
        assert state.chosen in state.scores and len(state.scores) >= 3
        for seed in (1, 2):
            row = protocol.read_result(experiment.run_dir(variant, seed))
            assert row["lr"] == pytest.approx(1e-3 * state.chosen)
            assert row["steps"] == 30 and row["cpu_s"] > 0 and row["wall_s"] > 0
            assert {"test_perplexity", "val_perplexity", "commit", "cpu", "load_before"} <= set(row)
            assert row["convergence"]["evaluations"] >= 10
            curve = protocol.validation_curve(experiment.run_dir(variant, seed))
            assert [r["step"] for r in curve][-1] == 30 and all("cpu_s" in r for r in curve)
    # A second worker finds everything finished and trains nothing.
    marker = os.path.getmtime(os.path.join(experiment.run_dir("cat", 2), protocol.RESULT))
    assert run.main([path, "--out-root", out_root]) == 0
    assert os.path.getmtime(os.path.join(experiment.run_dir("cat", 2),
                                         protocol.RESULT)) == marker
    docs = tmp_path / "docs"
    page = protocol_report.page(experiment, str(docs), ANCHORS, commit="abc")
    text = open(page).read()
    assert "causal CAT beats attention" in text and "## Verdicts" in text
    assert any(word in text for word in protocol.VERDICTS)
    assert "byte 4-gram (the runs must beat it)" in text
    assert (docs / "tiny_protocol.png").stat().st_size > 0
    exported = docs / "tiny_protocol" / "cat-seed1.safetensors"
    assert exported.stat().st_size > 0
    row = protocol.read_result(experiment.run_dir("cat", 1))
    assert cli.main(["--evaluate", str(exported), "--split", "test"]) == 0
    scored = dict(item.split("=") for item in capsys.readouterr().out.split())
    # The run scored eval_batches windows; --evaluate scores the whole split.
    assert float(scored["perplexity"]) > 1 and scored["step"] == "30"
    assert cli.main(["--evaluate", experiment.run_dir("cat", 1), "--split", "test"]) == 0
    assert capsys.readouterr().out.split() == [f"{k}={v}" for k, v in scored.items()]


def test_report_main_builds_a_protocol_page(tmp_path, fake_anchors):
    path = write(tmp_path)
    out_root = str(tmp_path / "runs")
    assert run.main([path, "--out-root", out_root, "--set", "train.steps=12",
                     "train.eval_points=10"]) == 0
    assert report.main([path, "--docs", str(tmp_path / "docs"), "--out-root", out_root]) == 0
    text = (tmp_path / "docs" / "tiny_protocol.md").read_text()
    assert "Learning-rate sweep" in text and "x0.5:" in text


def test_evaluate_scores_a_text_file_and_names_bad_arguments(tmp_path, fake_anchors, capsys):
    path = write(tmp_path)
    out_root = str(tmp_path / "runs")
    run.main([path, "--out-root", out_root, "--seeds", "1", "--variants", "attention"])
    directory = load_experiment(path, out_root).run_dir("attention", 1)
    text = tmp_path / "mine.txt"
    text.write_text("It is a truth universally acknowledged. " * 20)
    capsys.readouterr()
    assert cli.main(["--evaluate", directory, "--text", str(text)]) == 0
    assert "perplexity=" in capsys.readouterr().out
    text.write_text("short")
    assert cli.main(["--evaluate", directory, "--text", str(text)]) == 2
    assert "fewer than one window" in capsys.readouterr().err
    assert cli.main(["--evaluate", str(tmp_path / "nowhere")]) == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 64)
    assert cli.main(["--evaluate", str(tmp_path / "bad.safetensors")]) == 2
    assert "not a subquad-train checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--split", "test"])
