"""A one-line progress bar on stderr: step, loss, tokens/s and the time left."""

import sys
import time

BAR_WIDTH = 24


def format_seconds(seconds: float) -> str:
    seconds = int(round(max(seconds, 0)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else \
        f"{rest // 60:02d}:{rest % 60:02d}"


class Progress:
    """update(step, loss, tokens) after each step (tokens processed by that step); the
    rate and ETA count only the steps of this process (a resumed run starts afresh)."""

    def __init__(self, first_step: int, total: int, enabled: bool = True, stream=None):
        self.first, self.total, self.enabled = first_step, total, enabled
        self.stream = stream or sys.stderr
        self.start, self.tokens = time.perf_counter(), 0

    def rate(self) -> float:
        elapsed = time.perf_counter() - self.start
        return self.tokens / elapsed if elapsed > 0 else 0.0

    def update(self, step: int, loss: float, tokens: int) -> None:
        self.tokens += tokens
        if not self.enabled:
            return
        done = step + 1
        elapsed = time.perf_counter() - self.start
        per_step = elapsed / max(done - self.first, 1)
        filled = BAR_WIDTH * done // self.total
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        self.stream.write(f"\r[{bar}] {done}/{self.total} loss {loss:.4f} "
                          f"{self.rate():,.0f} tok/s ETA {format_seconds(per_step * (self.total - done))}")
        if done == self.total:
            self.stream.write("\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if self.enabled:
            self.stream.write("\r" + text + "\n")
            self.stream.flush()
