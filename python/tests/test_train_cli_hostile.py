"""subquad-train against a careless or hostile user: every bad config, file, run directory
and checkpoint ends in one line `subquad-train: error: ...` naming the key or the file,
with exit status 2 and no traceback. Each case is one row of CASES: how to set it up and
what the message must name. The cases that must succeed instead (a torn last metrics
row, overrides after --resume, harmless differences on resume) follow the table."""

import contextlib
import fcntl
import io
import json
import os
import re
import shutil
import sys

import pytest

pytest.importorskip("torch")
from subquad.data import austen, ett, fashion_mnist  # noqa: E402
from subquad.train import cli  # noqa: E402
from subquad.train.loop import CHECKPOINT  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
COMMON = ["model.dim=16", "model.heads=2", "model.layers=2", "run.threads=1",
          "run.progress=false", "train.steps=4", "train.warmup=0", "train.log_every=1",
          "train.eval_every=2", "train.checkpoint_every=2"]
FAMILY = {
    "lm": ["data.length=16", "train.batch_size=2", "train.eval_batches=1"],
    "mlm": ["data.length=16", "train.batch_size=2", "train.eval_batches=1"],
    "vit": ["model.patch=7", "data.train_size=32", "data.eval_size=8",
            "train.batch_size=4"],
    "regression": ["train.batch_size=4", "train.eval_batches=1"],
    "forecast": ["data.context=32", "data.horizon=8", "model.patch=8", "train.batch_size=4",
                 "train.eval_batches=1"],
}
NEEDS = {"lm": austen, "mlm": austen, "vit": fashion_mnist, "forecast": ett}


def config(family, *overrides, out="run"):
    """A case's builder: `--config configs/<family>.toml`, tiny settings, run.out under
    the case's directory, then `overrides` (table.key=value, or CLI flags)."""
    def build(tmp):
        return ["--config", os.path.join(CONFIGS, f"{family}.toml"), *COMMON,
                *FAMILY[family], f'run.out="{tmp / out}"', *overrides]
    build.family = family
    return build


def toml_file(text, *overrides):
    """A case's builder: a config file holding `text`."""
    def build(tmp):
        path = tmp / "config.toml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return ["--config", str(path), *overrides]
    build.family = None
    return build


def with_setup(setup, builder):
    """`builder` after setup(tmp) prepared the case's directory."""
    def build(tmp):
        setup(tmp)
        return builder(tmp)
    build.family = getattr(builder, "family", None)
    return build


FINISHED = {}  # family -> a finished tiny run the cases copy


def finished_run(tmp, family="regression"):
    """Copies a finished 4-step run (checkpoint, metrics, config) of `family` to tmp/run."""
    if family not in FINISHED:
        import pathlib
        import tempfile

        root = pathlib.Path(tempfile.mkdtemp(prefix="subquad-hostile-"))
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli.main(config(family)(root)) == 0
        FINISHED[family] = root / "run"
    shutil.copytree(FINISHED[family], tmp / "run")
    return tmp / "run"


def finished_lm_run(tmp):
    return finished_run(tmp, "lm")


def truncate_checkpoint(tmp):
    path = finished_run(tmp) / CHECKPOINT
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def garbage_checkpoint(tmp):
    (finished_run(tmp) / CHECKPOINT).write_bytes(b"\x07" * 100)


def checkpoint_directory(tmp):
    path = finished_run(tmp) / CHECKPOINT
    path.unlink()
    path.mkdir()


def corrupt_metrics_row(tmp):
    path = finished_run(tmp) / "metrics.jsonl"
    lines = path.read_text().splitlines(True)
    lines[1] = "{not json\n"
    path.write_text("".join(lines))


def started_run(tmp):
    """A run killed before its first checkpoint: config.json and metrics rows only."""
    run = finished_run(tmp)
    (run / CHECKPOINT).unlink()


LOCKS = []  # claim files locked by live_claim, open for the rest of the tests


def live_claim(tmp):
    """run.out held by a live claim: its CLAIM locked through a descriptor of its own,
    which flock treats as another process's."""
    (tmp / "run").mkdir()
    fd = os.open(tmp / "run" / "CLAIM", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, str(os.getppid()).encode())
    LOCKS.append(fd)


def full_disk(name, finished=False):
    """run.out/<name> (of a finished run, or of an empty directory) is /dev/full: every
    write to it fails with ENOSPC."""
    def setup(tmp):
        if finished:
            finished_run(tmp)
            if (tmp / "run" / name).exists():
                (tmp / "run" / name).unlink()
        else:
            (tmp / "run").mkdir()
        os.symlink("/dev/full", tmp / "run" / name)
    return setup


def a_file(name):
    def setup(tmp):
        (tmp / name).write_text("not a directory")
    return setup


def a_directory(name):
    def setup(tmp):
        (tmp / name).mkdir()
    return setup


SEED_BEYOND_BOUND = 2 ** 62
# (case id, builder, what the one-line message must match)
CASES = [
    # -- the model family decides the attention direction -----------------------------
    ("lm-exact-bidirectional", config("lm", "model.attention_options={exact={causal=false}}"),
     r"model\.attention_options\.exact\.causal"),
    ("mlm-exact-causal", config("mlm", "model.attention_options={exact={causal=true}}"),
     r"model\.attention_options\.exact\.causal"),
    ("lm-mlr-bidirectional", config("lm", 'model.attention="mlr"',
                                    "model.attention_options={mlr={causal=false}}"),
     r"model\.attention_options\.mlr\.causal"),
    ("lm-btt-bidirectional", config("lm", 'model.attention="btt"',
                                    "model.attention_options={btt={causal=false}}"),
     r"model\.attention_options\.btt\.causal"),
    ("lm-bilinear-mlr-bidirectional",
     config("lm", 'model.attention="bilinear-mlr"',
            'model.attention_options={"bilinear-mlr"={causal=false}}'),
     r"model\.attention_options\.bilinear-mlr\.causal"),
    # -- a layer that cannot learn: bilinear MLR levels of < 4 LayerNorm features -------
    ("lm-bilinear-mlr-sign-levels",
     config("lm", 'model.attention="bilinear-mlr"',
            'model.attention_options={"bilinear-mlr"={ranks=[2, 1]}}'),
     r"model\.attention_options\.bilinear-mlr\.ranks: \[2, 1\] gives level\(s\) \[0, 1\] "
     r"r_l 2\^l = \[2, 2\]"),
    ("regression-exact-bidirectional",
     config("regression", "model.attention_options={exact={causal=false}}"),
     r"model\.attention_options\.exact\.causal"),
    ("forecast-exact-causal", config("forecast", "model.attention_options={exact={causal=true}}"),
     r"model\.attention_options\.exact\.causal"),
    ("vit-exact-causal", config("vit", "model.attention_options={exact={causal=true}}"),
     r"model\.attention_options\.exact\.causal"),
    ("vit-circulant2d-causal",
     config("vit", 'model.attention="circulant2d"', 'model.pool="mean"',
            "model.attention_options={circulant2d={causal=true}}"),
     r"model\.attention_options\.circulant2d\.causal"),
    ("lm-torch-bidirectional", config("lm", 'model.attention="torch"',
                                      "model.attention_options={torch={causal=false}}"),
     r"model\.attention_options\.torch\.causal"),
    ("lm-sliding-window-bidirectional",
     config("lm", 'model.attention="sliding-window"',
            'model.attention_options={"sliding-window"={window=4, causal=false}}'),
     r"model\.attention_options\.sliding-window\.causal"),
    ("lm-pattern-bidirectional",
     config("lm", 'model.pattern=["cat-causal", "exact"]',
            "model.attention_options={exact={causal=false}}"),
     r"model\.attention_options\.exact\.causal"),
    # -- options for entries the model does not have, misspelt entries ----------------
    ("misspelt-entry", config("lm", "model.attention_options={cat_causal={threads=1}}"),
     r"cat_causal.*registered: exact, sliding-window"),
    ("entry-not-in-model", config("lm", "model.attention_options={mlr={ranks=[4, 4]}}"),
     r"model\.attention_options\.mlr.*no mlr layer"),
    ("vit-circulant2d-options-without-circulant2d",
     config("vit", "model.attention_options={circulant2d={scale_mode=\"paper\"}}"),
     r"model\.attention_options\.circulant2d.*no circulant2d layer"),
    ("misspelt-attention", config("lm", 'model.attention="cat_causal"'),
     r"cat_causal.*registered"),
    ("misspelt-pattern-entry", config("lm", 'model.pattern=["exact", "mlrr"]'),
     r"mlrr.*registered"),
    ("unknown-option", config("lm", "model.attention_options={exact={windw=4}}"),
     r"windw.*accepted"),
    ("circulant2d-block-unknown-option",
     config("vit", 'model.attention="circulant2d"', 'model.pool="mean"',
            "model.attention_options={circulant2d={gate=false}}"),
     r"gate.*accepted"),
    ("options-not-a-table", config("lm", "model.attention_options={exact=5}"),
     r"model\.attention_options\.exact"),
    ("sliding-window-without-window", config("lm", 'model.attention="sliding-window"'),
     r"sliding-window.*window"),
    ("rope-not-a-bool", config("lm", 'model.attention_options={exact={rope="yes"}}'),
     r"rope"),
    ("layer-threads-too-many", config("lm", "model.attention_options={exact={threads=4096}}"),
     r"threads.*1024"),
    ("layer-threads-negative", config("lm", "model.attention_options={exact={threads=-1}}"),
     r"threads"),
    # -- numbers: non-finite, absurd, out of range ------------------------------------
    ("mlp-ratio-inf", config("regression", "model.mlp_ratio=inf"), r"model\.mlp_ratio"),
    ("mlp-ratio-nan", config("regression", "model.mlp_ratio=nan"), r"model\.mlp_ratio"),
    ("mlp-ratio-huge", config("regression", "model.mlp_ratio=1e30"), r"model\.mlp_ratio"),
    ("lr-inf", config("regression", "train.lr=inf"), r"train\.lr"),
    ("lr-nan", config("regression", "train.lr=nan"), r"train\.lr"),
    ("lr-huge", config("regression", "train.lr=1e30"), r"train\.lr"),
    ("weight-decay-inf", config("regression", "train.weight_decay=inf"),
     r"train\.weight_decay"),
    ("weight-decay-huge", config("regression", "train.weight_decay=1e6"),
     r"train\.weight_decay"),
    ("clip-nan", config("regression", "train.clip=nan"), r"train\.clip"),
    ("min-lr-ratio-nan", config("regression", "train.min_lr_ratio=nan"),
     r"train\.min_lr_ratio"),
    ("attention-scale-inf", config("regression", "model.attention_scale=inf"),
     r"model\.attention_scale"),
    ("betas-inf", config("regression", "train.betas=[0.9, inf]"), r"train\.betas"),
    ("seed-2-62", config("regression", f"run.seed={SEED_BEYOND_BOUND}"), r"run\.seed"),
    ("seed-negative", config("regression", "run.seed=-1"), r"run\.seed"),
    ("seed-2-64", config("regression", "run.seed=18446744073709551616"), r"run\.seed"),
    ("steps-beyond-streams", config("regression", "train.steps=1000000000000"),
     r"train\.steps"),
    ("threads-4096", config("regression", "run.threads=4096"), r"run\.threads.*1024"),
    ("threads-zero", config("regression", "run.threads=0"), r"run\.threads"),
    ("bpe-vocab-1e9", config("lm", 'data.tokenizer="bpe"', "data.vocab_size=1000000000"),
     r"data\.vocab_size"),
    ("bpe-vocab-beyond-the-text", config("lm", 'data.tokenizer="bpe"',
                                         "data.vocab_size=5000000"), r"data\.vocab_size"),
    ("dim-huge", config("regression", "model.dim=1000000", "model.heads=1"), r"model\.dim"),
    ("layers-huge", config("regression", "model.layers=10000000"), r"model\.layers"),
    ("points-huge", config("regression", "data.points=1000000000"), r"data\.points"),
    ("dims-huge", config("regression", "data.dims=1000000000"), r"data\.dims"),
    ("horizon-huge", config("forecast", "data.horizon=1000000000"), r"data\.horizon"),
    ("batch-huge", config("regression", "train.batch_size=1000000000"),
     r"train\.batch_size"),
    ("length-huge", config("lm", "data.length=1000000000"), r"data\.length"),
    ("forecast-unknown-dataset", config("forecast", 'data.dataset="ETTh3"'),
     r"data\.dataset"),
    # -- the config's structure -------------------------------------------------------
    ("run-is-a-number", toml_file("run = 5\n"), r"config\.toml.*\brun\b.*table"),
    ("model-is-a-string", toml_file('model = "exact"\n[run]\nfamily = "lm"\n'),
     r"config\.toml.*\bmodel\b.*table"),
    ("override-into-a-number", toml_file("run = 5\n", "run.seed=1"), r"\brun\b.*table"),
    ("family-missing", toml_file("[run]\nseed = 1\n"), r"run\.family"),
    ("config-is-a-directory", with_setup(a_directory("config.toml"), lambda tmp: [
        "--config", str(tmp / "config.toml")]), r"config\.toml"),
    ("config-not-utf8", toml_file(b"[run]\nfamily = \"\xff\xfe\"\n"), r"config\.toml"),
    ("config-missing", lambda tmp: ["--config", str(tmp / "nowhere.toml")],
     r"nowhere\.toml.*not found"),
    # -- the run directory ------------------------------------------------------------
    ("out-is-a-file", with_setup(a_file("run"), config("regression")), r"run\.out.*run"),
    ("out-below-a-file", with_setup(a_file("blocker"), config("regression", out="blocker/run")),
     r"run\.out.*blocker"),
    ("out-empty", lambda tmp: config("regression")(tmp) + ['run.out=""'], r"run\.out"),
    ("rerun-finished-without-resume", with_setup(finished_run, config("regression")),
     r"run\.out.*holds a run.*--resume.*--overwrite"),
    ("rerun-started-without-resume", with_setup(started_run, config("regression")),
     r"run\.out.*holds a run.*--overwrite"),
    ("directory-in-use", with_setup(live_claim, config("regression", "--resume")),
     r"run\.out.*in use by process"),
    # -- resume -----------------------------------------------------------------------
    ("resume-other-lr", with_setup(finished_run, config("regression", "train.lr=0.01",
                                                        "--resume")),
     r"train\.lr: 0\.003 -> 0\.01"),
    ("resume-fewer-steps", with_setup(finished_run, config("regression", "train.steps=2",
                                                           "--resume")),
     r"train\.steps: 4 -> 2.*not fewer"),
    ("resume-other-model", with_setup(finished_run, config("regression", "model.dim=32",
                                                           "--resume")),
     r"model\.dim: 16 -> 32"),
    ("resume-truncated-checkpoint", with_setup(truncate_checkpoint,
                                               config("regression", "--resume")),
     r"checkpoint\.safetensors"),
    ("resume-garbage-checkpoint", with_setup(garbage_checkpoint,
                                             config("regression", "--resume")),
     r"checkpoint\.safetensors"),
    ("resume-checkpoint-is-a-directory", with_setup(checkpoint_directory,
                                                    config("regression", "--resume")),
     r"checkpoint\.safetensors"),
    ("resume-corrupt-metrics-row", with_setup(corrupt_metrics_row,
                                              config("regression", "--resume")),
     r"metrics\.jsonl.*line 2"),
    # -- a full disk ------------------------------------------------------------------
    ("disk-full-checkpoint", with_setup(full_disk("checkpoint.safetensors.partial"),
                                        config("regression", "--resume")),
     r"checkpoint\.safetensors.*[Nn]o space left"),
    ("disk-full-metrics", with_setup(full_disk("metrics.jsonl.tmp", finished=True),
                                     config("regression", "--resume")),
     r"metrics\.jsonl.*[Nn]o space left"),
    ("disk-full-config-json", with_setup(full_disk("config.json", finished=True),
                                         config("regression", "--resume")),
     r"config\.json.*[Nn]o space left"),
    # -- the other commands -----------------------------------------------------------
    ("evaluate-truncated-checkpoint", with_setup(truncate_checkpoint, lambda tmp: [
        "--evaluate", str(tmp / "run")]), r"checkpoint\.safetensors"),
    ("evaluate-text-is-a-directory", with_setup(a_directory("text"), with_setup(
        finished_lm_run, lambda tmp: ["--evaluate", str(tmp / "run"), "--text",
                                      str(tmp / "text")])),
     r"--text.*text"),
    ("compare-missing-run", lambda tmp: ["--compare", str(tmp / "nowhere")], r"nowhere"),
    ("compare-plot-into-a-directory", with_setup(a_directory("plot.png"), with_setup(
        finished_run, lambda tmp: ["--compare", str(tmp / "run"), "--plot",
                                   str(tmp / "plot.png")])), r"plot\.png"),
]
for _, builder, _ in CASES:
    builder.family = getattr(builder, "family", None)


def run_cli(argv):
    """(exit status, stdout, stderr) of subquad-train in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case, builder, pattern", CASES, ids=[c[0] for c in CASES])
def test_every_bad_input_is_one_line_naming_the_key(case, builder, pattern, tmp_path):
    module = NEEDS.get(builder.family)
    if module is not None and not os.path.exists(module.DIRECTORY):
        pytest.skip(f"{module.PACKAGE} missing (scripts/install.sh installs it)")
    code, _, err = run_cli(builder(tmp_path))
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("subquad-train: error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err


def test_a_torn_last_metrics_row_does_not_block_resume(tmp_path):
    run = finished_run(tmp_path)
    metrics = run / "metrics.jsonl"
    rows = metrics.read_text()
    metrics.write_text(rows + '{"step": 5, "split": "tra')  # killed during an append
    code, out, err = run_cli(config("regression", "--resume")(tmp_path))
    assert code == 0, err
    assert metrics.read_text() == rows  # the torn row is gone, the others kept


def test_overrides_after_resume_and_harmless_differences(tmp_path):
    finished_run(tmp_path)
    relative = os.path.relpath(tmp_path / "run")
    argv = config("regression")(tmp_path)
    argv = [a for a in argv if not a.startswith("run.out=")]
    # progress, the spelling of run.out: what the run computes is the same.
    code, out, err = run_cli(argv[:2] + ["--resume"] + argv[2:] + [
        f'run.out="{relative}"', "run.progress=true"])
    assert code == 0, err
    assert "mse=" in out


def test_overwrite_starts_the_run_again(tmp_path):
    run = finished_run(tmp_path)
    (run / "metrics.jsonl").write_text('{"step": 99, "split": "train", "loss": 1.0}\n')
    code, _, err = run_cli(config("regression", "--overwrite")(tmp_path))
    assert code == 0, err
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()]
    assert 99 not in steps and steps[-1] == 4


def test_two_trainers_on_one_directory(tmp_path):
    """A second process on a directory a live trainer holds stops at once, naming it; the
    lock of a process that died is taken over."""
    import subprocess

    argv = config("regression", "train.steps=100000", "train.checkpoint_every=100000",
                  "train.eval_every=100000")(tmp_path)
    command = [sys.executable, "-m", "subquad.train.cli", *argv]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        claim = tmp_path / "run" / "CLAIM"
        for _ in range(600):
            if claim.exists() and claim.read_text().strip() == str(first.pid):
                break
            if first.poll() is not None:
                pytest.fail(first.stderr.read().decode())
            __import__("time").sleep(0.1)
        second = subprocess.run(command + ["--resume"], capture_output=True, text=True)
        assert second.returncode == 2
        assert f"in use by process {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.kill()
        first.wait()
    # first was killed: its lock is stale and the next trainer takes it over.
    code, out, err = run_cli(config("regression", "--overwrite")(tmp_path))
    assert code == 0, err
    assert not (tmp_path / "run" / "CLAIM").exists()  # released at the end
