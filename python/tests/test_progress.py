"""Progress lines (subquad.progress): on a file or a pipe a few plain lines, on a terminal one
line redrawn in place; the same for subquad-train's and subquad-llm's bars, and a trainer
run piped to a file writes a dozen lines, not one per step."""

import io
import os

import pytest

from subquad.progress import LOG_INTERVAL_S, LOG_LINES, ProgressLine


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


class FakeClock:
    """Seconds that advance by `step` at each reading."""

    def __init__(self, step):
        self.now, self.step = 0.0, step

    def __call__(self):
        self.now += self.step
        return self.now


def test_a_pipe_gets_a_line_per_tenth_not_per_step():
    stream = io.StringIO()
    line = ProgressLine(300, stream, clock=FakeClock(0.01))
    for done in range(1, 301):
        line.show(done, f"step {done}")
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "step 1" and lines[-1] == "step 300"
    assert len(lines) == LOG_LINES + 1
    assert lines == [f"step {n}" for n in [1] + [30 * k for k in range(1, 11)]]


def test_a_pipe_still_hears_from_slow_steps():
    stream = io.StringIO()
    line = ProgressLine(50, stream, clock=FakeClock(LOG_INTERVAL_S))  # a minute per step
    for done in range(1, 51):
        line.show(done, f"step {done}")
    assert len(stream.getvalue().splitlines()) == 50


def test_a_terminal_redraws_one_line():
    stream = FakeTerminal()
    line = ProgressLine(300, stream, clock=FakeClock(1.0))  # slow enough to draw each step
    assert line.interactive
    for done in range(1, 301):
        line.show(done, "x" * (10 if done < 150 else 5) + f" {done}")
    text = stream.getvalue()
    assert text.count("\r") == 300 and text.count("\n") == 1 and text.endswith("300\n")
    # A shorter line pads over the longer one it replaces.
    shorter = text.split("\r")[150]
    assert shorter.startswith("xxxxx 150") and len(shorter) == len("xxxxxxxxxx 149")


def test_a_terminal_redraws_at_most_ten_times_a_second_but_always_the_end():
    stream = FakeTerminal()
    line = ProgressLine(300, stream, clock=FakeClock(0.001))
    for done in range(1, 301):
        line.show(done, f"step {done}")
    text = stream.getvalue()
    assert text.count("\r") < 10 and text.endswith("step 300\n")


def test_a_message_ends_the_drawn_line_on_a_terminal_and_is_one_line_in_a_pipe():
    terminal = FakeTerminal()
    line = ProgressLine(10, terminal, clock=FakeClock(1.0))
    line.show(3, "bar 3/10 and more")
    line.message("step 3: loss 1.0")
    line.show(4, "bar 4/10")
    line.close()
    assert terminal.getvalue() == "\rbar 3/10 and more\rstep 3: loss 1.0 \n\rbar 4/10\n"
    pipe = io.StringIO()
    line = ProgressLine(10, pipe)
    line.message("step 3: loss 1.0")
    line.close()
    assert pipe.getvalue() == "step 3: loss 1.0\n"


def test_disabled_writes_nothing():
    stream = FakeTerminal()
    line = ProgressLine(5, stream, enabled=False)
    line.show(1, "x")
    line.message("y")
    line.close()
    assert stream.getvalue() == ""


def test_the_training_bar_in_a_pipe_and_on_a_terminal():
    from subquad.train.progress import Progress

    pipe = io.StringIO()
    progress = Progress(0, 300, stream=pipe)
    for step in range(300):
        progress.update(step, 2.5, 1024)
    lines = pipe.getvalue().splitlines()
    assert len(lines) <= LOG_LINES + 1 and "\r" not in pipe.getvalue()
    assert lines[-1].startswith("[" + "#" * 24 + "] 300/300 loss 2.5000")
    terminal = FakeTerminal()
    progress = Progress(0, 300, stream=terminal)
    for step in range(300):
        progress.update(step, 2.5, 1024)
    assert terminal.getvalue().count("\n") == 1 and "300/300" in terminal.getvalue()


def test_the_llm_bar_in_a_pipe():
    pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    pytest.importorskip("gguf")
    from subquad.llm.cli import Progress

    pipe = io.StringIO()
    bar = Progress(200, "passkey", stream=pipe)
    for done in range(1, 201):
        bar(done, "full ok")
    bar.close()
    lines = pipe.getvalue().splitlines()
    assert len(lines) <= LOG_LINES + 1 and lines[-1].startswith("passkey [")
    assert "200/200" in lines[-1]


def test_a_training_run_piped_to_a_file_writes_a_dozen_lines(tmp_path, capsys):
    pytest.importorskip("torch")
    from subquad import train
    from subquad.train import cli

    configs = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
    code = cli.main(["--config", os.path.join(configs, "regression.toml"), "model.dim=32",
                     "model.heads=2", "model.layers=1", "run.threads=1", "train.warmup=2",
                     "train.batch_size=4", "train.eval_batches=1", "train.steps=60",
                     "train.eval_every=30", f'run.out="{tmp_path}"'])
    assert code == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "60/60" in err
    assert len(err.splitlines()) <= LOG_LINES + 1 + 2  # the bar and the two evaluations
    assert train  # the package imported
