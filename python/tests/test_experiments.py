"""The experiment configs of configs/experiments run end to end (every variant, one seed,
two steps of a tiny model; the invalid bilinear MLR variants two pages record are refused
by the trainer, naming the ranks), their results pages and plots are written, an interrupted
run resumes, a finished one is skipped, and the WildCat swap runs on the trained masked
LM and ViTs (with McNemar pairs and the class-token row's error on the protocol's) and
the resolution sweep times both ViTs. Keeps the configs from rotting; the
real runs are in docs/results/."""

import glob
import json
import multiprocessing
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from subquad.data import austen, fashion_mnist  # noqa: E402
from subquad.experiments import load_experiment, report, resolution_speed, run  # noqa: E402
from subquad.experiments import wildcat_swap  # noqa: E402
from subquad.train.config import ConfigError  # noqa: E402
from subquad.train import rundir, tasks  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EXPERIMENTS = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "experiments",
                                                        "*.toml"))
                     if "[experiment]" in open(p).read())
TINY = ["model.dim=16", "model.layers=2", "train.steps=2", "train.warmup=0",
        "train.eval_every=2", "train.eval_points=0", "train.checkpoint_every=2",
        "train.log_every=1", "train.batch_size=2", "train.patience=0"]
FAMILY_TINY = {  # lm: 128 tokens, a multiple of 2^(L-1) for MLR's 8 levels
    "lm": ["data.length=128", "train.eval_batches=1"],
    "mlm": ["data.length=32", "train.eval_batches=1"],
    # CA-DeiT has 64 heads of 1; the protocol's held-out validation shrinks to 64 images
    "vit": ["data.train_size=64", "data.eval_size=8", "data.validation_size=64",
            "model.dim=64"],
    "regression": ["train.eval_batches=1"],
    # the protocol files' MLR ranks 8|4|2|2 need one head of 16 and 8 patches
    "forecast": ["data.context=128", "data.horizon=8", "train.eval_batches=1",
                 "model.heads=1"],
    "retrieval": ["train.eval_batches=1", "model.dim=64"],  # d = 32 probe: 32 heads of 2
}
NEEDS = {"lm": austen, "mlm": austen, "vit": fashion_mnist}


def tiny(experiment):
    family = experiment.base["run"]["family"]
    module = NEEDS.get(family)
    if module is not None and not os.path.exists(module.DIRECTORY):
        pytest.skip(f"{module.PACKAGE} missing (scripts/install.sh installs it)")
    return TINY + FAMILY_TINY[family]


def test_there_are_experiments():
    names = {os.path.basename(p) for p in EXPERIMENTS}
    assert {"cat_mlm.toml", "vit_fmnist.toml", "icl_regression.toml"} <= names


def skip_the_protocol_stages(experiment, monkeypatch):
    """For an evidence-protocol file: its sweep counted as done at the configured rate and
    an anchor every tiny model beats, so that one reported seed per variant runs (the
    sweep and the real anchors are tested in test_protocol_run and test_anchors)."""
    if experiment.protocol is None:
        return
    from subquad.experiments import protocol, protocol_report

    done = protocol.SweepState({1.0: 0.0}, [], 1.0)
    for module in (run, protocol_report):
        monkeypatch.setattr(module, "sweep_state", lambda experiment, variant: done)
    value = 1e9 if experiment.lower_is_better else -1e9
    metric = experiment.metrics[0]
    anchors = {experiment.protocol.anchor: {split: {metric: value}
                                            for split in ("validation", "test")}}
    for module in (run, protocol):
        monkeypatch.setattr(module, "experiment_anchors", lambda experiment: anchors)


def score_test_on_validation(monkeypatch):
    """The ViT's test split (all 10,000 images: test_vision_task's) replaced by the tiny
    runs' validation images."""
    validation = tasks.VisionTask.split_data
    monkeypatch.setattr(tasks.VisionTask, "split_data",
                        lambda task, split: validation(task, "validation"))


def sign_levels(variant) -> bool:
    """Whether a variant's bilinear MLR ranks give a level of < 4 LayerNorm features, which
    the trainer refuses (the invalid setups of the d = 8 and icl_axes pages, kept as the
    records of what ran)."""
    model = variant.tables.get("model", {})
    options = model.get("attention_options", {}).get("bilinear-mlr", {})
    return any(r << level < 4 for level, r in enumerate(options.get("ranks", [4])))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=os.path.basename)
def test_experiment_runs_every_variant_and_reports(path, tmp_path, monkeypatch, capsys):
    experiment = load_experiment(path, str(tmp_path / "runs"))
    overrides = tiny(experiment)
    skip_the_protocol_stages(experiment, monkeypatch)
    if experiment.base["run"]["family"] == "vit":
        score_test_on_validation(monkeypatch)
    seed = experiment.seeds[0]
    common = ["--seeds", str(seed), "--out-root", str(tmp_path / "runs"), "--set", *overrides]
    refused = [v for v in experiment.variants if sign_levels(v)]
    trained = [v for v in experiment.variants if v not in refused]
    for variant in refused:
        assert run.main([path, "--variants", variant.name, *common]) == 2
        assert "bilinear-mlr.ranks" in capsys.readouterr().err
    status = run.main([path, "--variants", *(v.name for v in trained), *common])
    assert status == 0
    for variant in trained:
        with open(os.path.join(experiment.run_dir(variant.name, seed), run.RESULT)) as file:
            row = json.load(file)
        assert row["steps"] == 2 and row["params"] > row["attention_params"] > 0
        value = row[f"val_{experiment.metrics[0]}"]
        assert value == value and abs(value) < float("inf")
    docs = tmp_path / "docs"
    assert report.main([path, "--docs", str(docs), "--out-root", str(tmp_path / "runs")]) == 0
    page = (docs / f"{experiment.name}.md").read_text()
    assert all(report.table_cell(v.label) in page for v in trained)
    assert (docs / f"{experiment.name}.png").stat().st_size > 0
    # A rebuilt page keeps what was written below the notes marker.
    (docs / f"{experiment.name}.md").write_text(page + "\nreading of the results\n")
    report.main([path, "--docs", str(docs), "--out-root", str(tmp_path / "runs")])
    assert "reading of the results" in (docs / f"{experiment.name}.md").read_text()


def test_a_rebuilt_page_keeps_its_notes_on_the_line_after_the_marker(tmp_path):
    path = str(tmp_path / "page.md")
    report.write_page(path, f"# page\n\n{report.NOTES}")
    assert open(path).read() == f"# page\n\n{report.NOTES}\n"
    # Notes written straight after the marker (a page from before the fix) move to the
    # next line, where a heading renders; notes already there stay as they are.
    for written in ("## Notes\nreading\n", "\n## Notes\nreading\n"):
        with open(path, "w") as file:
            file.write(f"# old page\n{report.NOTES}{written}")
        report.write_page(path, f"# new page\n{report.NOTES}")
        assert open(path).read() == f"# new page\n{report.NOTES}\n## Notes\nreading\n"


def test_finished_runs_are_skipped_and_interrupted_ones_resume(tmp_path):
    path = os.path.join(ROOT, "configs", "experiments", "icl_regression.toml")
    experiment = load_experiment(path, str(tmp_path))
    overrides = tiny(experiment) + ["train.steps=4", "train.checkpoint_every=2",
                                    "train.eval_every=4"]
    variant = experiment.variants[0]
    config = experiment.config(variant, 0, overrides)
    from subquad.train.loop import Trainer
    Trainer(config, stop_at=2).run()  # interrupted after its step-2 checkpoint
    row = run.run_one(experiment, variant, 0, overrides)
    assert row["resumed_from_step"] == 2 and row["steps"] == 4
    assert run.run_one(experiment, variant, 0, overrides) is None  # finished: skipped


def test_a_claim_of_a_live_process_is_respected_and_a_dead_ones_is_free(tmp_path):
    directory = str(tmp_path / "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from subquad.train import rundir; "
         "assert rundir.claim(sys.argv[1]); print(flush=True); time.sleep(600)", directory],
        stdout=subprocess.PIPE)
    try:
        holder.stdout.readline()
        assert not run.claim(directory)
        assert rundir.owner(directory) == holder.pid  # named in the message
    finally:
        holder.kill()
        holder.wait()
    assert run.claim(directory) and rundir.holds(directory)
    run.release(directory)
    assert not rundir.holds(directory)
    assert not os.path.exists(os.path.join(directory, "CLAIM"))


def _claim_in_step(directories, barrier, won_path):
    with open(won_path, "w") as won:
        for directory in directories:
            barrier.wait()
            if run.claim(directory):
                won.write(directory + "\n")


def test_workers_racing_for_one_run_never_both_take_it(tmp_path):
    """Workers that reach the same unclaimed run at the same moment: exactly one takes it
    (a claim must never be visible before it names its owner)."""
    context = multiprocessing.get_context("fork")
    directories = [str(tmp_path / f"run{i}") for i in range(60)]
    barrier = context.Barrier(4)
    won = [tmp_path / f"won{i}" for i in range(4)]
    workers = [context.Process(target=_claim_in_step, args=(directories, barrier, path))
               for path in won]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    taken = [line for path in won for line in path.read_text().splitlines()]
    assert sorted(taken) == sorted(directories)  # each once: no run twice, none lost


def test_bad_experiment_files_name_the_problem(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[experiment]\nname = "x"\nseeds = [0]\nmetrics = ["loss"]\n'
                   '[run]\nfamily = "mlm"\n[[variant]]\nname = "a"\n'
                   'model = { atention = "exact" }\n')
    with pytest.raises(ConfigError, match="variant 'a'.*model.atention"):
        load_experiment(str(bad))
    bad.write_text('[experiment]\nname = "x"\nseeds = [0]\nmetrics = ["loss"]\n'
                   '[run]\nfamily = "mlm"\n')
    with pytest.raises(ConfigError, match="no \\[\\[variant\\]\\]"):
        load_experiment(str(bad))


def train_source(spec, tmp_path, seed=0, longer=()):
    """Trains `seed` of the swap's source variant (tiny, 2 steps, unless `longer`
    overrides say otherwise) under tmp_path/runs and points spec at the source file;
    returns the overrides the runs were made with."""
    source = load_experiment(os.path.join(ROOT, spec["source"]), str(tmp_path / "runs"))
    overrides = tiny(source) + list(longer)
    assert run.main([os.path.join(ROOT, spec["source"]), "--seeds", str(seed), "--variants",
                     spec["variant"], "--out-root", str(tmp_path / "runs"),
                     "--set", *overrides]) == 0
    spec["source"] = os.path.join(ROOT, spec["source"])
    return overrides


def test_wildcat_swap_on_the_trained_masked_lm(tmp_path):
    spec_path = os.path.join(ROOT, "configs", "experiments", "wildcat_mlm.toml")
    spec = wildcat_swap.load_swap(spec_path)
    overrides = train_source(spec, tmp_path)
    spec["ranks"], spec["repeats"] = [4, 32], 1
    rows = wildcat_swap.run(spec, overrides, str(tmp_path / "runs"))
    exact = [r for r in rows if r["method"] == "exact"]
    assert len(exact) == 1 and len(rows) == 1 + len(spec["methods"]) * 2
    # r = T keeps every key: WildCat without bins is exact attention again, and closer
    # to it than with 4 of the 32 keys.
    full = [r for r in rows if r["label"] == "WildCat" and r["rank"] == 32]
    assert full[0]["perplexity"] == pytest.approx(exact[0]["perplexity"], rel=1e-4)
    # (Up to WildCat's early stop on near-duplicate keys, which the 2-step model has.)
    few = [r for r in rows if r["label"] == "WildCat" and r["rank"] == 4]
    assert 0 <= full[0]["layer_error"] < few[0]["layer_error"]
    assert all(r["speedup"] > 0 for r in rows)
    wildcat_swap.page(spec, rows, str(tmp_path / "docs"), 1.0, str(tmp_path / "runs"))
    assert (tmp_path / "docs" / "wildcat_mlm.png").stat().st_size > 0


def test_wildcat_swap_on_the_trained_vit_every_layer_and_first_only(tmp_path, monkeypatch):
    spec_path = os.path.join(ROOT, "configs", "experiments", "wildcat_vit.toml")
    spec = wildcat_swap.load_swap(spec_path)
    assert spec["first_layer"]
    overrides = train_source(spec, tmp_path)
    tokens = 14 * 14 + 1  # 2 x 2 patches of 28 x 28 pixels and the class token
    spec["ranks"], spec["repeats"] = [4, tokens], 2
    rows = wildcat_swap.run(spec, overrides, str(tmp_path / "runs"))
    assert len(rows) == 1 + len(spec["methods"]) * 2
    assert {r["tokens"] for r in rows} == {tokens}
    exact = rows[0]
    assert exact["method"] == "exact" and exact["accuracy_first_layer"] == exact["accuracy"]
    # r = T without bins keeps every key, in every layer and in the first alone.
    full = next(r for r in rows if r["label"] == "WildCat" and r["rank"] == tokens)
    assert full["accuracy"] == exact["accuracy"]
    assert full["accuracy_first_layer"] == exact["accuracy"]
    few = next(r for r in rows if r["label"] == "WildCat" and r["rank"] == 4)
    assert 0 <= full["layer_error"] < few["layer_error"]
    for row in rows:
        assert 0 < row["layer_min_s"] <= row["layer_s"]
        assert 0 < row["exact_min_s"] <= row["exact_s"]
        assert row["speedup"] == pytest.approx(row["exact_s"] / row["layer_s"])
        assert row["core_speedup"] > 0 and row["core_speedup_min"] > 0
    assert rows[0]["wall_s"] > 0
    # A second call reads the seed's rows back; other settings measure again.
    def measured(*args):
        raise AssertionError("measured again")

    monkeypatch.setattr(wildcat_swap, "run_seed", measured)
    assert wildcat_swap.run(spec, overrides, str(tmp_path / "runs")) == rows
    spec["repeats"] = 3
    with pytest.raises(AssertionError, match="measured again"):
        wildcat_swap.run(spec, overrides, str(tmp_path / "runs"))
    text = open(wildcat_swap.page(spec, rows, str(tmp_path / "docs"), 1.0,
                                  str(tmp_path / "runs"))).read()
    assert "first layer only" in text and "parameters (" in text
    assert (tmp_path / "docs" / "wildcat_vit.png").stat().st_size > 0


def protocol_swap(monkeypatch):
    """wildcat_vit_protocol's spec, its source's protocol stages skipped and the test split
    scored on the tiny runs' validation images."""
    spec = wildcat_swap.load_swap(os.path.join(ROOT, "configs", "experiments",
                                               "wildcat_vit_protocol.toml"))
    score_test_on_validation(monkeypatch)
    skip_the_protocol_stages(load_experiment(os.path.join(ROOT, spec["source"])),
                             monkeypatch)
    return spec


def test_wildcat_swap_protocol_pairs_each_image_and_reads_the_class_token_row(tmp_path,
                                                                             monkeypatch):
    spec = protocol_swap(monkeypatch)
    assert spec["split"] == "test" and spec["first_layer"]
    assert {m["method"] for m in spec["methods"]} == set(wildcat_swap.METHODS)
    # A reported seed (not the tuning one), trained long enough (30 steps) that its
    # predictions differ between images and a poor replacement changes some of them.
    overrides = train_source(spec, tmp_path, seed=1, longer=[
        "train.steps=30", "train.eval_every=30", "train.checkpoint_every=30"])
    spec["ranks"], spec["repeats"] = [8], 1  # (r = T is test_wildcat_swap_on_the_trained_vit's)
    rows = wildcat_swap.run(spec, overrides, str(tmp_path / "runs"), seeds=[1])
    assert len(rows) == 1 + len(spec["methods"])
    exact, count = rows[0], 64
    source = load_experiment(os.path.join(ROOT, spec["source"]), str(tmp_path / "runs"))
    with open(os.path.join(source.run_dir(spec["variant"], 1), run.RESULT)) as file:
        reported = json.load(file)
    assert exact["accuracy"] == reported["test_accuracy"]  # the model the run reports
    assert exact["mcnemar_p"] == 1.0 and exact["discordant"] == 0 and exact["cls_error"] == 0
    for row in rows:
        for suffix in ("", "_first_layer"):
            # The discordant pairs are the accuracy difference, image by image.
            assert row[f"discordant{suffix}"] == (row[f"only_swapped{suffix}"] +
                                                  row[f"only_exact{suffix}"])
            assert row[f"accuracy{suffix}"] - exact["accuracy"] == pytest.approx(
                (row[f"only_swapped{suffix}"] - row[f"only_exact{suffix}"]) / count)
            assert 0 < row[f"mcnemar_p{suffix}"] <= 1
        assert row["speedup"] > 0
        if row is not exact:  # 8 of 197 keys: every replacement errs, on row 0 too
            assert row["cls_error"] > 0 and row["layer_error"] > 0
    assert any(r["discordant"] > 0 for r in rows)  # the pairing is put to the test
    performer_row = next(r for r in rows if r["method"] == "performer")
    assert performer_row["features"] == 15  # floor(8 x 33 / 17) at head dim 16
    text = open(wildcat_swap.page(spec, rows, str(tmp_path / "docs"), 1.0,
                                  str(tmp_path / "runs"))).read()
    assert "McNemar" in text and "class-token row" in text and "floor(r (Dk" in text
    # The pre-registered equivalence takes no part while a source model has not converged.
    assert f"keeps accuracy within ±{spec['margin']:.0%}" in text
    assert "**not tested**: did not converge: source seed 1" in text


def test_keeping_the_metric_is_the_protocols_paired_equivalence():
    spec = {"metric": "accuracy", "margin": 0.01}
    exact = [{"seed": s, "accuracy": 0.9} for s in (1, 2, 3)]

    def swapped(*changes):
        return [{"seed": s, "label": "WildCat", "accuracy": 0.9 * (1 + c)}
                for s, c in zip((1, 2, 3), changes)]

    keeps = wildcat_swap.keeps_metric
    # Paired relative changes -0.2%, -0.3%, -0.1%: mean -0.2%, t-interval -0.2 +- 4.30 x
    # 0.1 / sqrt(3) = [-0.45%, +0.05%], inside +-1%.
    assert keeps(spec, swapped(-0.002, -0.003, -0.001), exact, [], False) == (
        "**reproduced**: -0.20% [-0.45, +0.05], the interval lies within +-1%")
    assert keeps(spec, swapped(-0.05, -0.06, -0.04), exact, [], False).startswith(
        "**contradicted**")
    # An interval wider than the margin shows neither a match nor a loss, and says so.
    assert keeps(spec, swapped(0.0, -0.03, 0.02), exact, [], False).endswith(
        "the interval is wider than +-1%: neither a match nor a difference is shown")
    assert keeps(spec, swapped(0.0, -0.03, 0.02), exact, [], False).startswith(
        "**no difference at convergence**")
    assert keeps(spec, swapped(0.0, 0.0, 0.0), exact, ["source seed 2"], False) == (
        "**not tested**: did not converge: source seed 2")
    assert keeps(spec, swapped(0.0)[:1], exact, [], False).startswith("**not tested**")


def test_the_swap_starts_from_the_weights_an_early_stopped_run_reports(tmp_path,
                                                                        monkeypatch):
    spec = protocol_swap(monkeypatch)
    # Evaluations every 5 steps, patience 1: seed 1 stops at step 10, its best at step 5.
    overrides = train_source(spec, tmp_path, seed=1, longer=[
        "train.steps=30", "train.eval_every=5", "train.checkpoint_every=5",
        "train.patience=1"])
    source = load_experiment(spec["source"], str(tmp_path / "runs"))
    config = source.config(source.variant(spec["variant"]), 1, overrides)
    path = os.path.join(config["run"]["out"], "checkpoint.safetensors")
    from subquad.train import checkpoint

    best = checkpoint.best_weights(path)
    assert best is not None
    task = wildcat_swap.trained(config)
    last = tasks.make_task(config)
    checkpoint.load(path, last.model, None)
    state, last_state = task.model.state_dict(), last.model.state_dict()
    assert all(torch.equal(state[name], best[name]) for name in state)
    assert not all(torch.equal(state[name], last_state[name]) for name in state)
    assert not task.model.training


def test_relative_errors_of_all_rows_and_of_the_class_token_row():
    exact = torch.ones(2, 3, 4)
    y = exact.clone()
    y[:, 0] *= 2  # the class token's row off by 100%, the others exact
    errors = wildcat_swap.relative_errors(y, exact, class_token=True)
    assert errors["cls_error"] == pytest.approx(1.0)
    assert errors["layer_error"] == pytest.approx(1 / 3 ** 0.5)  # 8 of 24 squares
    y = exact.clone()
    y[:, 1:] = 0
    errors = wildcat_swap.relative_errors(y, exact, class_token=True)
    assert errors["cls_error"] == 0 and errors["layer_error"] == pytest.approx((2 / 3) ** 0.5)
    assert "cls_error" not in wildcat_swap.relative_errors(y, exact, class_token=False)


def test_wildcat_swap_first_only_replaces_one_layer_and_restores():
    from subquad.layers.exact import ExactAttention
    from subquad.models.vit import ViTClassifier

    model = ViTClassifier(8, 2, 1, 10, dim=16, heads=2, layers=3)
    original = [block.attention for block in model.blocks]

    def make(old):
        return wildcat_swap.WildcatAttention(old.dim, old.heads, rank=4,
                                             bias=old.w_q.bias is not None)

    old = wildcat_swap.swap(model, make, first_only=True)
    kinds = [type(block.attention) for block in model.blocks]
    assert old == original[:1]
    assert kinds == [wildcat_swap.WildcatAttention, ExactAttention, ExactAttention]
    wildcat_swap.restore(model, old)
    assert [block.attention for block in model.blocks] == original
    old = wildcat_swap.swap(model, make)
    assert old == original
    assert all(isinstance(b.attention, wildcat_swap.WildcatAttention) for b in model.blocks)


def test_wildcat_swap_refuses_rope_attention():
    from subquad.models.language import MaskedLM

    model = MaskedLM(256, 16, dim=16, heads=2, layers=1, position_embedding="none",
                     attention_options={"exact": {"rope": True}})
    with pytest.raises(ValueError, match="rope"):
        wildcat_swap.swap(model, lambda old: None)


def test_interleaved_times_calls_the_layers_in_turn():
    calls = []

    def layer(name):
        return lambda x: calls.append(name)

    times = wildcat_swap.interleaved_times([layer("a"), layer("b")], torch.zeros(1), 3)
    assert calls == ["a", "b"] + ["a", "b"] * 3  # one warm-up call each, then in turn
    assert [len(t) for t in times] == [3, 3] and all(t >= 0 for t in times[0] + times[1])


def test_wildcat_swap_refuses_a_bad_spec(tmp_path):
    bad = tmp_path / "bad.toml"
    body = ('[wildcat]\nname = "x"\nsource = "s.toml"\nvariant = "a"\nmetric = "loss"\n'
            'ranks = [4]\nmethods = [{ method = "wildcat" }]\n')
    bad.write_text(body + 'first_layer = "yes"\n')
    with pytest.raises(ConfigError, match="wildcat.first_layer: expected true or false"):
        wildcat_swap.load_swap(str(bad))
    bad.write_text(body + "repeats = 0\n")
    with pytest.raises(ConfigError, match="wildcat.repeats: expected an integer >= 1"):
        wildcat_swap.load_swap(str(bad))
    bad.write_text(body + 'split = "train"\n')
    with pytest.raises(ConfigError, match="wildcat.split: expected one of"):
        wildcat_swap.load_swap(str(bad))
    bad.write_text(body.replace('"wildcat" }', '"favor" }'))
    with pytest.raises(ConfigError, match="method 'favor' is not one of"):
        wildcat_swap.load_swap(str(bad))


def test_resolution_speed_times_both_vits(tmp_path):
    spec = resolution_speed.load_speed(os.path.join(ROOT, "configs", "experiments",
                                                    "ca_speed.toml"))
    spec.update(dim=16, repeats=1)
    rows = resolution_speed.measure(spec, [4, 6])
    assert [(r["grid"], r["method"]) for r in rows] == [
        ("4x4", "exact"), ("4x4", "circulant2d"), ("6x6", "exact"), ("6x6", "circulant2d")]
    assert all(0 < r["min_s"] <= r["median_s"] <= r["max_s"] for r in rows)
    path = resolution_speed.page(spec, rows, str(tmp_path), 1.0)
    assert "6x6" in open(path).read() and (tmp_path / "ca_speed.png").stat().st_size > 0
