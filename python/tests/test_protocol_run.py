"""A tiny experiment run end to end by the evidence protocol: the sweep on the tuning seed,
the reported seeds at the chosen rate with log-spaced evaluations, the test split and the
convergence test in every result, a second run that skips what is finished, the results
page with its verdicts, and committed model-only checkpoints that subquad-train
--evaluate scores to the same test figures."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
from subquad.data import austen  # noqa: E402
from subquad.experiments import protocol, protocol_report, report, run  # noqa: E402
from subquad.experiments.flops import training_flop_counter  # noqa: E402
from subquad.experiments.spec import load_experiment  # noqa: E402
from subquad.train import cli  # noqa: E402

from test_protocol import write  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(austen.DIRECTORY),
                                reason="r-cran-janeaustenr missing (scripts/install.sh)")
ANCHORS = {"4-gram": {"validation": {"perplexity": 1e9}, "test": {"perplexity": 1e9}},
           "1-gram": {"validation": {"perplexity": 2e9}, "test": {"perplexity": 2e9}}}


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
    assert "tiny_protocol cat seed 2: started" in printed  # a line as each run starts
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
    assert "4-gram (the runs must beat it)" in text
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
    # Variants of two widths: the page says so, and their curves share a FLOPs axis.
    with open(path) as f:
        text = f.read().replace('attention = "cat-causal" }', 'attention = "cat-causal", dim = 8 }')
    with open(path, "w") as f:
        f.write(text)
    out_root = str(tmp_path / "runs")
    assert run.main([path, "--out-root", out_root, "--set", "train.steps=12",
                     "train.eval_points=10"]) == 0
    assert report.main([path, "--docs", str(tmp_path / "docs"), "--out-root", out_root]) == 0
    text = (tmp_path / "docs" / "tiny_protocol.md").read_text()
    assert "Learning-rate sweep" in text and "x0.5:" in text
    assert "Scale: dim 8 / 16 (by variant), 1 layers, 2 heads, 12 steps of batch 2" in text
    experiment = load_experiment(path, out_root)
    rows = protocol_report.reported_rows(experiment)
    configs = report.run_configs(experiment, rows)
    axes, curves = protocol_report.run_curves(experiment, rows, configs)
    assert [key for key, _ in axes] == ["step", "cpu_s", "flops"]
    final = {variant: curve[-1] for (variant, _), curve in curves.items()}
    for variant, point in final.items():
        counter = training_flop_counter(configs[variant, 1])
        assert point["step"] == 12 and point["flops"] == counter(12) > 0
    assert final["attention"]["flops"] > final["cat"]["flops"]  # the wider model costs more


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


def language_task(length, batch_size, eval_batches):
    from subquad.train.config import resolve
    from subquad.train.tasks import make_task

    torch.manual_seed(0)
    task = make_task(resolve({
        "run": {"family": "lm"}, "data": {"length": length},
        "model": {"dim": 16, "heads": 2, "layers": 1},
        "train": {"batch_size": batch_size, "eval_batches": eval_batches, "steps": 2,
                  "warmup": 0}}))
    task.model.eval()
    return task


def direct_losses(task, windows):
    """Per-token next-token losses [windows, length] of the first windows of validation."""
    import torch.nn.functional as F

    ids = torch.from_numpy(task.eval_ids[:windows * (task.length + 1)]).view(windows, -1)
    with torch.no_grad():
        logits, _ = task.model(ids[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(),
                           reduction="none").view(windows, task.length).double()


def test_the_whole_split_is_scored_with_every_token_weighted_alike():
    task = language_task(length=64, batch_size=100, eval_batches=0)
    result = task.evaluate("validation")
    windows = len(task.eval_ids) // 65
    assert windows == 3586  # every window, the last chunk of 86 weighted by its size
    assert result["loss"] == pytest.approx(float(direct_losses(task, windows).mean()), rel=1e-6)
    assert "loss_positions_lt128" not in result  # windows of 64 have no long context
    assert set(task.evaluate("test")) == set(result)
    with pytest.raises(ValueError, match="split"):
        task.evaluate("train")


def test_long_windows_report_the_loss_of_short_and_long_context_positions():
    task = language_task(length=600, batch_size=3, eval_batches=1)
    result = task.evaluate("validation")
    losses = direct_losses(task, 3)
    assert result["loss_positions_lt128"] == pytest.approx(float(losses[:, :128].mean()))
    assert result["loss_positions_ge512"] == pytest.approx(float(losses[:, 512:].mean()))
