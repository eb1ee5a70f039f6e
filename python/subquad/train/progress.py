"""The progress of a training run on stderr: step, loss, tokens/s and the time left, redrawn
on one line on a terminal, a dozen plain lines in a log or a pipe (subquad.progress)."""

import time

from ..progress import ProgressLine, format_seconds

BAR_WIDTH = 24


class Progress:
    """update(step, loss, tokens) after each step (tokens processed by that step); the
    rate and ETA count only the steps of this process (a resumed run starts afresh)."""

    def __init__(self, first_step: int, total: int, enabled: bool = True, stream=None,
                 interactive=None):
        self.first, self.total = first_step, total
        self.line = ProgressLine(total, stream, enabled, interactive)
        self.start, self.tokens = time.perf_counter(), 0

    def rate(self) -> float:
        elapsed = time.perf_counter() - self.start
        return self.tokens / elapsed if elapsed > 0 else 0.0

    def update(self, step: int, loss: float, tokens: int) -> None:
        self.tokens += tokens
        done = step + 1
        elapsed = time.perf_counter() - self.start
        per_step = elapsed / max(done - self.first, 1)
        filled = BAR_WIDTH * done // self.total
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        eta = format_seconds(per_step * (self.total - done))
        self.line.show(done, f"[{bar}] {done}/{self.total} loss {loss:.4f} "
                             f"{self.rate():,.0f} tok/s ETA {eta}")

    def message(self, text: str) -> None:
        self.line.message(text)

    def close(self) -> None:
        """Ends the line of a run stopped before its last step."""
        self.line.close()
