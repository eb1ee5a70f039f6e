"""subquad.train and subquad-train: every family's config trains a few steps on real data
with falling loss, resuming from a checkpoint is bit-identical to an uninterrupted run,
metrics and plots are written, and bad configs fail with errors that name the key."""

import json
import math
import os

import pytest

torch = pytest.importorskip("torch")
from subquad import train  # noqa: E402
from subquad.data import austen, fashion_mnist  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from subquad.train import cli  # noqa: E402
from subquad.train.loop import CHECKPOINT, Trainer  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
TINY = ["model.dim=32", "model.heads=2", "model.layers=2", "run.threads=1",
        "run.progress=false", "train.warmup=2", "train.log_every=1"]
FAMILY_TINY = {
    "lm": ["data.length=32", "train.batch_size=4", "train.eval_batches=1"],
    "mlm": ["data.length=32", "train.batch_size=4", "train.eval_batches=1"],
    "vit": ["model.patch=7", "data.train_size=256", "data.eval_size=64",
            "train.batch_size=16"],
    "regression": ["train.batch_size=16", "train.eval_batches=1"],
    "forecast": ["data.context=32", "data.horizon=8", "model.patch=8", "train.batch_size=8",
                 "train.eval_batches=1"],
    "retrieval": ["train.batch_size=16", "train.eval_batches=1"],
}
NEEDS = {"lm": austen, "mlm": austen, "vit": fashion_mnist}


def tiny_config(family, out, steps, *extra):
    module = NEEDS.get(family)
    if module is not None and not os.path.exists(module.DIRECTORY):
        pytest.skip(f"{module.PACKAGE} missing (scripts/install.sh installs it)")
    overrides = TINY + FAMILY_TINY[family] + [f"train.steps={steps}",
                                              f"train.eval_every={steps}",
                                              f"train.checkpoint_every={steps}",
                                              f'run.out="{out}"', *extra]
    return train.load(os.path.join(CONFIGS, f"{family}.toml"), overrides)


def train_losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as file:
        rows = [json.loads(line) for line in file]
    return [row["loss"] for row in rows if row["split"] == "train"]


# Steps of each family's smoke run: enough for the loss on fresh batches to fall clearly.
FAMILY_STEPS = {"lm": 30, "mlm": 30, "vit": 60, "regression": 30, "forecast": 30,
                "retrieval": 30}


@pytest.mark.parametrize("family", train.FAMILIES)
def test_family_config_trains_with_falling_loss(family, tmp_path):
    steps = FAMILY_STEPS[family]
    config = tiny_config(family, tmp_path, steps, "train.lr=3e-3")
    result = Trainer(config).run()
    losses = train_losses(tmp_path)
    assert len(losses) == steps and all(map(torch.isfinite, torch.tensor(losses)))
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    if family == "regression":
        # In-context regression sits on a plateau near the zero predictor's loss (1) for
        # hundreds of steps (Garg et al.); its falling loss on a fixed batch is tested in
        # test_models.py. Here: the loss stays at that plateau, not above it.
        assert last < 1.5, losses
        # the references on the same prompts: least squares (the best possible) < zero
        assert 0 < result["least_squares_mse"] < 0.9 * result["zero_mse"], result
    elif family == "retrieval":
        # Retrieval too starts on a plateau, at chance (log keys); its falling loss on a
        # fixed batch is tested in test_retrieval.py. Here: it stays there, not above.
        assert last < 1.1 * math.log(config["data"]["keys"]), losses
    else:
        assert last < 0.9 * first, losses
    assert "loss" in result and result["loss"] == result["loss"]  # evaluated, not NaN
    for name in ("metrics.csv", "metrics.jsonl", "loss.png", CHECKPOINT, "config.json"):
        assert os.path.getsize(tmp_path / name) > 0, name


@pytest.mark.parametrize("family", ["lm", "regression"])
def test_resume_is_bit_identical(family, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    Trainer(tiny_config(family, whole, 8)).run()
    interrupted = Trainer(tiny_config(family, parts, 8), stop_at=3)
    interrupted.run()
    resumed = Trainer(tiny_config(family, parts, 8), resume=True)
    assert resumed.start == 3
    resumed.run()
    a = load_file(str(whole / CHECKPOINT))
    b = load_file(str(parts / CHECKPOINT))
    assert a.keys() == b.keys() and any(k.startswith("optimizer.") for k in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert train_losses(whole) == train_losses(parts)


def test_resume_with_another_config_is_refused(tmp_path):
    Trainer(tiny_config("regression", tmp_path, 4)).run()
    with pytest.raises(train.ConfigError, match="another configuration"):
        Trainer(tiny_config("regression", tmp_path, 4, "train.lr=1e-2"), resume=True)


def test_resume_with_more_steps_continues_the_run(tmp_path, capsys):
    Trainer(tiny_config("regression", tmp_path, 4)).run()
    same = ("train.eval_every=4", "train.checkpoint_every=4")
    longer = Trainer(tiny_config("regression", tmp_path, 8, *same), resume=True)
    assert longer.start == 4 and "continuing from 4 to 8 steps" in capsys.readouterr().err
    longer.run()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert max(row["step"] for row in rows) == 8
    with pytest.raises(train.ConfigError, match="not fewer"):
        Trainer(tiny_config("regression", tmp_path, 6, *same), resume=True)


def test_bf16_autocast_trains(tmp_path):
    config = tiny_config("forecast", tmp_path, 4, "train.precision=\"bf16\"")
    result = Trainer(config).run()
    assert torch.isfinite(torch.tensor(result["mse"]))


@pytest.mark.parametrize("family, attention", [
    ("vit", ['model.attention="circulant2d"', 'model.pool="mean"']),  # no learned positions
    ("vit", ['model.pattern=["circulant2d", "exact"]', 'model.pool="mean"']),
    ("lm", ['model.attention="cat-causal"']),
    ("mlm", ['model.attention="cat"']),
    ("regression", ['model.attention="mlr"']),
    ("forecast", ['model.attention="btt"']),
])
def test_bf16_trains_every_family(family, attention, tmp_path):
    """train.precision = "bf16" is documented for every family and entry: the residual
    stream stays in the parameters' dtype whatever the first layer autocasts to."""
    config = tiny_config(family, tmp_path, 2, 'train.precision="bf16"', "train.warmup=0",
                         *attention)
    result = Trainer(config).run()
    assert torch.isfinite(torch.tensor(result["loss"]))


def test_learning_rate_schedule():
    settings = {"lr": 1.0, "warmup": 10, "steps": 110, "min_lr_ratio": 0.1}
    assert train.learning_rate(0, settings) == pytest.approx(0.1)
    assert train.learning_rate(9, settings) == pytest.approx(1.0)
    assert train.learning_rate(60, settings) == pytest.approx(0.55, abs=0.01)
    assert train.learning_rate(109, settings) == pytest.approx(0.1)


@pytest.mark.parametrize("overrides, message", [
    (["model.dimm=3"], r"unknown key model.dimm; accepted: \["),
    (["train.steps=\"ten\""], r"train.steps: expected int, got 'ten'"),
    (["model.mup=1"], r"model.mup: expected bool, got 1"),
    (["data.dims=4"], r"data.dims does not apply to family 'lm'"),
    (["model.heads=3"], r"model.heads: expected a divisor of model.dim = 64"),
    (["model.pattern=[\"cat-causal\", \"exact\", \"exact\"]"], r"must divide model.layers"),
    (["train.warmup=500"], r"train.warmup: expected < train.steps"),
    (["train.precision=\"fp8\""], r"train.precision: expected one of"),
    (["train.lr=-1"], r"train.lr: expected > 0"),
    (["run.family=\"gan\""], r"run.family: expected one of"),
    (["nodot=1"], r"expected table.key=value"),
])
def test_bad_configs_name_the_key(overrides, message):
    with pytest.raises(train.ConfigError, match=message):
        train.load(os.path.join(CONFIGS, "lm.toml"), overrides)


def test_unknown_table_and_bad_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[run]\nfamily = "lm"\n[optimiser]\nlr = 1\n')
    with pytest.raises(train.ConfigError, match=r"unknown table\(s\) \['optimiser'\]"):
        train.load(str(path))
    path.write_text("[run\n")
    with pytest.raises(train.ConfigError, match="not valid TOML"):
        train.load(str(path))
    with pytest.raises(train.ConfigError, match="not found"):
        train.load(str(tmp_path / "missing.toml"))


def test_cli_reports_impossible_combinations(tmp_path, capsys):
    code = cli.main(["--config", os.path.join(CONFIGS, "lm.toml"), "model.attention=\"cat\"",
                     f'run.out="{tmp_path}"'])
    assert code == 2
    assert "cat does not support causal attention" in capsys.readouterr().err
    code = cli.main(["--config", os.path.join(CONFIGS, "vit.toml"),
                     "model.attention=\"circulant2d\"", f'run.out="{tmp_path}"'])
    assert code == 2 and "class token" in capsys.readouterr().err


def test_cli_trains_and_compares(tmp_path, capsys):
    for name in ("a", "b"):
        code = cli.main(["--config", os.path.join(CONFIGS, "regression.toml"), *TINY,
                         *FAMILY_TINY["regression"], "train.steps=4", "train.eval_every=2",
                         f'run.out="{tmp_path / name}"'])
        assert code == 0
    assert "mse=" in capsys.readouterr().out
    plot = tmp_path / "compare.png"
    assert cli.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--plot",
                     str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
