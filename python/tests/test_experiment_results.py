"""The experiment tools never publish or keep numbers of another configuration and never
replace results with less: a finished run made with another --set or an edited file
stops the runner naming the keys (result.json stores its configuration; older results are
checked against their run's config.json), a page describes the runs as they were made,
a report without finished runs leaves the page alone, and measuring some grids of the
resolution sweep merges into its CSV or refuses."""

import json
import os
import shutil

import pytest

pytest.importorskip("torch")
from subquad.experiments import load_experiment, protocol, protocol_report  # noqa: E402
from subquad.experiments import report, resolution_speed, run  # noqa: E402
from subquad.train.config import ConfigError  # noqa: E402

from test_protocol import write  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
REGRESSION = os.path.join(ROOT, "configs", "experiments", "icl_regression.toml")
TINY = ["model.dim=16", "model.layers=2", "train.steps=2", "train.warmup=0",
        "train.eval_every=2", "train.eval_points=0", "train.checkpoint_every=2",
        "train.log_every=1", "train.batch_size=2", "train.eval_batches=1"]


def run_regression(tmp_path, capsys, *extra, path=REGRESSION):
    """experiments.run of one variant, seed 0 -> (status, stderr)."""
    experiment = load_experiment(path, str(tmp_path / "runs"))
    status = run.main([path, "--seeds", "0", "--variants", experiment.variants[0].name,
                       "--out-root", str(tmp_path / "runs"), "--set", *TINY, *extra])
    return status, capsys.readouterr().err


def result_path(tmp_path, path=REGRESSION):
    experiment = load_experiment(path, str(tmp_path / "runs"))
    return os.path.join(experiment.run_dir(experiment.variants[0].name, 0), protocol.RESULT)


def test_a_changed_set_stops_the_runner_naming_the_keys(tmp_path, capsys):
    assert run_regression(tmp_path, capsys)[0] == 0
    result = result_path(tmp_path)
    stamp = os.path.getmtime(result)
    assert json.load(open(result))["config"]["train"]["steps"] == 2
    status, err = run_regression(tmp_path, capsys, "train.steps=3", "model.heads=2")
    assert status == 2
    assert "its result was made with another configuration" in err
    assert "train.steps: 2 -> 3" in err and "model.heads: 8 -> 2" in err
    assert os.path.getmtime(result) == stamp  # the old result neither used nor replaced
    # The same settings find it finished; progress and the spelling of the root may differ.
    assert run_regression(tmp_path, capsys, "run.progress=true")[0] == 0
    assert os.path.getmtime(result) == stamp


def test_an_edited_experiment_file_stops_the_runner(tmp_path, capsys):
    path = tmp_path / "icl.toml"
    shutil.copy(REGRESSION, path)
    assert run_regression(tmp_path, capsys, path=str(path))[0] == 0
    path.write_text(path.read_text().replace("[model]\n", "[model]\nmlp_ratio = 2\n", 1))
    status, err = run_regression(tmp_path, capsys, path=str(path))
    assert status == 2 and "model.mlp_ratio: 4.0 -> 2" in err


def test_a_result_without_its_configuration_is_checked_against_config_json(tmp_path, capsys):
    """Results written before they stored their configuration (a campaign of older
    workers) stand while their run's config.json is the expected configuration."""
    assert run_regression(tmp_path, capsys)[0] == 0
    result = result_path(tmp_path)
    row = json.load(open(result))
    del row["config"]
    json.dump(row, open(result, "w"))
    stamp = os.path.getmtime(result)
    assert run_regression(tmp_path, capsys)[0] == 0
    assert os.path.getmtime(result) == stamp
    status, err = run_regression(tmp_path, capsys, "train.batch_size=3")
    assert status == 2 and "train.batch_size: 2 -> 3" in err
    os.remove(os.path.join(os.path.dirname(result), "config.json"))
    status, err = run_regression(tmp_path, capsys)
    assert status == 2 and "no config.json" in err


def fake_result(experiment, directory, config, **row):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, protocol.RESULT), "w") as file:
        json.dump({"config": config, **row}, file)


def test_a_sweep_of_another_configuration_is_not_chosen_from(tmp_path):
    experiment = load_experiment(write(tmp_path), str(tmp_path / "runs"))
    variants = list(experiment.variants)
    for variant in variants:
        for factor, value in ((0.5, 9.0), (1.0, 8.0), (2.0, 8.5)):
            config = experiment.config(variant, 0, ["train.steps=12"], lr_factor=factor,
                                       sweep=True)
            fake_result(experiment, experiment.sweep_dir(variant.name, factor), config,
                        val_perplexity=value, lr=config["train"]["lr"])
    runs, waiting = run.pending_runs(experiment, variants, [1], ["train.steps=12"])
    assert [(v.name, seed, factor) for v, seed, factor, _ in runs] == [
        ("attention", 1, 1.0), ("cat", 1, 1.0)] and not waiting
    with pytest.raises(ConfigError, match="train.steps: 4 -> 10"):
        run.pending_runs(experiment, variants, [1])


def test_the_page_describes_the_runs_not_the_file(tmp_path, capsys):
    assert run_regression(tmp_path, capsys, "train.steps=3")[0] == 0
    docs = tmp_path / "docs"
    assert report.main([REGRESSION, "--docs", str(docs), "--out-root",
                        str(tmp_path / "runs")]) == 0
    experiment = load_experiment(REGRESSION)
    text = (docs / f"{experiment.name}.md").read_text()
    assert "3 steps of batch 2" in text and "seeds [0]" in text
    assert "--set" in text and "train.steps=3" in text and "model.dim=16" in text
    csv = (docs / f"{experiment.name}.csv").read_text()
    assert "config" not in csv.splitlines()[0].split(",")


def test_a_report_without_finished_runs_leaves_the_page(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    experiment = load_experiment(REGRESSION)
    page = docs / f"{experiment.name}.md"
    page.write_text("the published page\n")
    status = report.main([REGRESSION, "--docs", str(docs), "--out-root",
                          str(tmp_path / "mistyped")])
    assert status == 2 and "no finished runs" in capsys.readouterr().err
    assert page.read_text() == "the published page\n"
    assert sorted(os.listdir(docs)) == [page.name]
    # The same for a protocol page.
    path = write(tmp_path)
    protocol_experiment = load_experiment(path, str(tmp_path / "mistyped"))
    protocol_page = docs / f"{protocol_experiment.name}.md"
    protocol_page.write_text("the published page\n")
    with pytest.raises(ValueError, match="no finished runs"):
        protocol_report.page(protocol_experiment, str(docs), {})
    assert protocol_page.read_text() == "the published page\n"
    assert report.main(["nowhere.toml", "--docs", str(docs)]) == 2
    assert "nowhere.toml not found" in capsys.readouterr().err


SPEED = """[speed]
name = "speed"
grids = [4, 6]
dim = 16
heads = 2
layers = 1
patch = 2
batch = 1
repeats = 1
threads = 1
methods = [{{ attention = "exact", label = "attention" }},
           {{ attention = "circulant2d", label = "CA" }}]
{extra}"""


def test_measuring_some_grids_merges_or_refuses(tmp_path, capsys):
    spec, docs = tmp_path / "speed.toml", tmp_path / "docs"
    spec.write_text(SPEED.format(extra=""))
    assert resolution_speed.main([str(spec), "--docs", str(docs)]) == 0
    table = (docs / "speed.csv").read_text().splitlines()
    assert len(table) == 5 and [line.split(",")[0] for line in table[1:]] == [
        "4x4", "4x4", "6x6", "6x6"]
    six = [line for line in table if line.startswith("6x6")]
    assert resolution_speed.main([str(spec), "--docs", str(docs), "--grids", "4"]) == 0
    merged = (docs / "speed.csv").read_text().splitlines()
    assert len(merged) == 5 and [line for line in merged if line.startswith("6x6")] == six
    assert "6x6" in (docs / "speed.md").read_text()
    # Rows measured with other settings are not mixed with new ones: nothing is written.
    spec.write_text(SPEED.format(extra="").replace("dim = 16", "dim = 8"))
    capsys.readouterr()
    assert resolution_speed.main([str(spec), "--docs", str(docs), "--grids", "4"]) == 2
    assert "6x6 were measured with other settings" in capsys.readouterr().err
    assert (docs / "speed.csv").read_text().splitlines() == merged
