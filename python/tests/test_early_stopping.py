"""Early stopping (train.patience): on a scripted validation curve a run ends after exactly
`patience` evaluations that do not beat its best (a tie does not), reports and restores
the best evaluation's weights, resumes to the same decision bit for bit, refuses more
steps once stopped, and is read as plateaued by the protocol runner, whose test split,
sweep score and --evaluate use the best weights."""

import json
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from subquad import train  # noqa: E402
from subquad.experiments import protocol, protocol_report, report, run  # noqa: E402
from subquad.experiments.spec import load_experiment  # noqa: E402
from subquad.train import checkpoint, cli, tasks  # noqa: E402
from subquad.train.evaluate import load_run  # noqa: E402
from subquad.train.loop import CHECKPOINT, EARLY_STOP, Trainer  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
TINY = ["model.dim=16", "model.heads=2", "model.layers=1", "run.threads=1",
        "run.progress=false", "train.warmup=2", "train.log_every=1", "train.batch_size=8",
        "train.eval_batches=1", "train.eval_every=1", "data.curriculum_dims_start=0",
        "data.curriculum_points_start=0"]
STEPS, PATIENCE = 12, 3
# The validation loss after each step: the best is step 5's 2.5; steps 6, 7 (a tie) and 8
# do not beat it, so patience 3 ends the run at step 8, before step 9's better loss.
SCRIPT = {1: 5.0, 2: 4.0, 3: 3.0, 4: 3.5, 5: 2.5, 6: 2.6, 7: 2.5, 8: 2.7, 9: 1.0, 10: 0.9,
          11: 0.8, 12: 0.7}
BEST, STOPPED = 5, 8


@pytest.fixture
def scripted(monkeypatch):
    """The regression task's validation loss follows SCRIPT by the step last trained (its
    other metrics, e.g. mse, stay the model's own); tasks that trained no step (the ones
    --evaluate builds) are not scripted."""
    batch, evaluate = tasks.RegressionTask.batch, tasks.RegressionTask.evaluate

    def scripted_batch(self, step):
        self.trained = step + 1
        return batch(self, step)

    def scripted_evaluate(self, split="validation"):
        result = evaluate(self, split)
        if split == "validation" and hasattr(self, "trained"):
            result["loss"] = SCRIPT[self.trained]
        return result

    monkeypatch.setattr(tasks.RegressionTask, "batch", scripted_batch)
    monkeypatch.setattr(tasks.RegressionTask, "evaluate", scripted_evaluate)


def config(out, *extra, steps=STEPS, patience=PATIENCE):
    return train.load(os.path.join(CONFIGS, "regression.toml"), TINY + [
        f"train.steps={steps}", f"train.checkpoint_every={steps}",
        f"train.patience={patience}", f'run.out="{out}"', *extra])


def rows(out, split):
    with open(os.path.join(out, "metrics.jsonl")) as file:
        return [row for row in map(json.loads, file) if row["split"] == split]


def model_tensors(path):
    return {name[len("model."):]: t for name, t in load_file(str(path)).items()
            if name.startswith("model.")}


def stopping_state(path):
    with safe_open(str(path), framework="pt") as file:
        return json.loads(file.metadata()["early_stopping"])


def test_patience_ends_the_run_and_restores_the_best_weights(tmp_path, scripted):
    trainer = Trainer(config(tmp_path / "run"))
    result = trainer.run()
    assert trainer.early_stopping() == {"patience": PATIENCE, "stopped_early": True,
                                        "best_step": BEST, "best_loss": 2.5,
                                        "stopped_at": STOPPED}
    validation = rows(tmp_path / "run", "validation")
    assert [row["step"] for row in validation] == list(range(1, STOPPED + 1))
    assert max(row["step"] for row in rows(tmp_path / "run", "train")) == STOPPED
    [stop] = rows(tmp_path / "run", EARLY_STOP)
    assert (stop["step"], stop["best_step"], stop["best_loss"]) == (STOPPED, BEST, 2.5)
    best_row = validation[BEST - 1]
    assert result == {k: v for k, v in best_row.items()
                      if k not in ("step", "split", "cpu_s", "wall_s")}
    assert result["loss"] == 2.5
    for name in ("metrics.csv", "loss.png"):
        assert os.path.getsize(tmp_path / "run" / name) > 0
    saved = tmp_path / "run" / CHECKPOINT
    assert checkpoint.read_metadata(str(saved))["step"] == str(STOPPED)
    assert stopping_state(saved)["stopped_at"] == STOPPED
    # The weights after step 5, from a run cut there: the model ends with them, and the
    # checkpoint keeps them beside the last step's.
    Trainer(config(tmp_path / "cut"), stop_at=BEST).run()
    at_best = model_tensors(tmp_path / "cut" / CHECKPOINT)
    last = model_tensors(saved)
    kept = checkpoint.best_weights(str(saved))
    state = trainer.model.state_dict()
    assert any(not torch.equal(last[name], at_best[name]) for name in at_best)
    for name, tensor in at_best.items():
        assert torch.isfinite(tensor).all() and torch.equal(state[name], tensor), name
        assert torch.equal(kept[name], tensor), name


def test_the_last_step_ends_a_run_normally_with_the_best_weights(tmp_path, scripted):
    """Patience never runs out here (the loss keeps improving after step 8 with patience
    4): the run trains every step and still reports its best evaluation (step 12's)."""
    trainer = Trainer(config(tmp_path, patience=4))
    assert trainer.run()["loss"] == SCRIPT[STEPS]
    assert trainer.early_stopping()["stopped_early"] is False
    assert trainer.early_stopping()["stopped_at"] == STEPS
    assert not rows(tmp_path, EARLY_STOP)


@pytest.mark.parametrize("kill", [3, 6])
def test_resume_makes_the_same_decision_bit_for_bit(tmp_path, scripted, kill):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    expected = Trainer(config(whole)).run()
    Trainer(config(parts), stop_at=kill).run()
    assert stopping_state(parts / CHECKPOINT)["stopped_at"] is None
    resumed = Trainer(config(parts), resume=True)
    assert resumed.start == kill
    assert resumed.run() == expected
    assert resumed.early_stopping()["stopped_at"] == STOPPED
    a, b = load_file(str(whole / CHECKPOINT)), load_file(str(parts / CHECKPOINT))
    assert a.keys() == b.keys() and any(k.startswith("best.") for k in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert stopping_state(whole / CHECKPOINT) == stopping_state(parts / CHECKPOINT)
    assert [r["loss"] for r in rows(whole, "train")] == [r["loss"] for r in rows(parts, "train")]
    # A finished run resumed trains nothing and reports the best weights again.
    again = Trainer(config(parts), resume=True)
    assert again.start == STOPPED and again.run() == expected
    state = again.model.state_dict()
    for name, tensor in checkpoint.best_weights(str(parts / CHECKPOINT)).items():
        assert torch.equal(state[name], tensor), name
    assert len(rows(parts, "train")) == STOPPED
    with pytest.raises(train.ConfigError, match="ended by early stopping at step 8"):
        Trainer(config(parts, "train.eval_every=1", steps=2 * STEPS), resume=True)


@pytest.mark.parametrize("overrides, message", [
    (["train.patience=-1"], r"train.patience: expected >= 0, got -1"),
    (["train.patience=4", "train.steps=100", "train.eval_every=25"],
     r"train.patience: expected < the run's 4 evaluations \(train.eval_every = 25"),
    (["train.patience=12", "train.steps=100", "train.eval_points=10"],
     r"expected < the run's 11 evaluations \(train.eval_points = 10"),
])
def test_patience_is_checked(overrides, message):
    with pytest.raises(train.ConfigError, match=message):
        train.load(os.path.join(CONFIGS, "regression.toml"), ["train.warmup=2", *overrides])
    assert train.load(os.path.join(CONFIGS, "regression.toml"))["train"]["patience"] == 0


def test_evaluate_scores_the_best_weights(tmp_path, scripted, capsys):
    trainer = Trainer(config(tmp_path))
    trainer.run()
    assert cli.main(["--evaluate", str(tmp_path)]) == 0
    scored = dict(item.split("=") for item in capsys.readouterr().out.split())
    assert scored["weights"] == "best" and scored["step"] == str(BEST)
    assert scored["early_stop_at"] == str(STOPPED)
    # The same drawn validation batch as the run's evaluation at step 5: the same mse.
    assert float(scored["mse"]) == pytest.approx(rows(tmp_path, "validation")[BEST - 1]["mse"],
                                                 rel=1e-5)


EXPERIMENT = """
[experiment]
name = "tiny_stop"
seeds = [1]
metrics = ["loss", "mse"]

[protocol]
anchor = "zero predictor"

[run]
family = "regression"
progress = false

[model]
dim = 16
heads = 2
layers = 1

[train]
steps = 12
batch_size = 8
warmup = 2
eval_every = 1
eval_batches = 1
log_every = 1
checkpoint_every = 12
patience = 3

[[variant]]
name = "a"

[[variant]]
name = "b"

[[claim]]
text = "b beats a"
variant = "b"
baseline = "a"
rule = "better"
"""
ANCHORS = {"zero predictor": {"validation": {"loss": 1e9, "mse": 1e9},
                              "test": {"loss": 1e9, "mse": 1e9}}}


def test_the_protocol_runner_reports_the_best_weights(tmp_path, scripted, monkeypatch, capsys):
    monkeypatch.setattr(run, "experiment_anchors", lambda experiment: ANCHORS)
    path = tmp_path / "experiment.toml"
    path.write_text(EXPERIMENT)
    experiment = load_experiment(str(path), str(tmp_path / "runs"))
    variant = experiment.variant("a")
    # The sweep run (4 steps) is not stopped, but scores its best evaluation (step 3's
    # 3.0, not step 4's 3.5): the sweep chooses on the best weights.
    swept = run.run_one(experiment, variant, 0, lr_factor=1.0, sweep=True)
    assert (swept["val_loss"], swept["best_step"], swept["stopped_early"]) == (3.0, 3, False)
    row = run.run_one(experiment, variant, 1, lr_factor=1.0)
    assert (row["val_loss"], row["best_step"], row["stopped_at"]) == (2.5, BEST, STOPPED)
    assert row["stopped_early"] and row["tokens_trained"] < row["tokens"]
    assert row["train_flops_trained"] < row["train_flops"]
    verdict = row["convergence"]
    # Plateaued by the early stop, but 8 evaluations are fewer than the protocol's 10.
    assert verdict["plateaued"] and verdict["early_stopped"] and not verdict["converged"]
    assert "early stopping ended it (early stop at step 8 (best 5))" in verdict["reason"]
    assert "8 evaluations (< 10)" in verdict["reason"]
    assert "early stop at step 8 (best 5)" in run.describe(experiment, row)
    assert "| early stop at step 8 (best 5) |" in protocol_report.seed_table(experiment, [row])
    assert "seed 1: early stop at step 8 (best 5)" in report.early_stops([row])
    # The summary counts the FLOPs the run trained, not its budget's.
    summary = protocol_report.summary_table(experiment, [row],
                                            report.run_configs(experiment, [row]))
    assert f"| {row['train_flops_trained']:.3g} |" in summary
    assert f"{row['train_flops']:.3g}" not in summary
    # The test split was scored with the best weights: --evaluate (best weights) on the
    # run and on its exported model-only file gives the same figures.
    directory = experiment.run_dir("a", 1)
    [exported] = protocol_report.export_checkpoints(experiment, [row], str(tmp_path / "docs"))
    capsys.readouterr()  # the runner's lines
    for source in (directory, exported):
        assert cli.main(["--evaluate", source, "--split", "test"]) == 0
        scored = dict(item.split("=") for item in capsys.readouterr().out.split())
        assert (scored["weights"], scored["step"]) == ("best", str(BEST))
        assert float(scored["mse"]) == pytest.approx(row["test_mse"], rel=1e-5)
    assert protocol.read_result(directory)["stopped_early"] is True
    # Rebuilding the page leaves an unchanged export's file alone (its bytes would differ:
    # safetensors orders metadata at random), and replaces one whose model differs.
    before = os.stat(exported)
    assert protocol_report.export_checkpoints(experiment, [row], str(tmp_path / "docs")) \
        == [exported]
    assert os.stat(exported).st_ino == before.st_ino
    assert not os.path.exists(exported + checkpoint.PARTIAL)
    task, step = load_run(exported)
    with torch.no_grad():
        next(task.model.parameters()).add_(1.0)
    changed = str(tmp_path / "changed.safetensors")
    metadata = checkpoint.read_metadata(exported)
    checkpoint.save(changed, task.model, None, step, json.loads(metadata["config"]),
                    json.loads(metadata["task_state"]), json.loads(metadata["clock"]),
                    stopping=checkpoint.early_stopping(metadata))
    assert not checkpoint.same_contents(changed, exported)
    shutil.copyfile(changed, exported)
    protocol_report.export_checkpoints(experiment, [row], str(tmp_path / "docs"))
    assert not checkpoint.same_contents(exported, changed)
