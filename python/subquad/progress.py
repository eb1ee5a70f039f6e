"""One progress line for long loops (subquad-train, subquad-llm, the experiment runner).

On a terminal the line is redrawn in place; on a file or a pipe (a log, CI) it is printed
as a plain line at the first update, at each tenth of the total, at the end, and at least
once a minute in between, so a log of a long run has a dozen lines, not one per step
(tqdm's behaviour, without the dependency).
"""

import sys
import time
from typing import Callable, Optional, TextIO

LOG_LINES = 10            # plain lines at each 1/LOG_LINES of the total
LOG_INTERVAL_S = 60.0     # ... and at least this often when steps are slow
REDRAW_INTERVAL_S = 0.1   # a terminal line is redrawn at most this often (but always the last)


def format_seconds(seconds: float) -> str:
    seconds = int(round(max(seconds, 0)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else \
        f"{rest // 60:02d}:{rest % 60:02d}"


def is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class ProgressLine:
    """show(done, text) after each unit of work (done counts from 1 to total, text is the
    whole line); message(text) prints a line of its own (an evaluation, a warning) without
    breaking the redrawn one. interactive: None detects a terminal."""

    def __init__(self, total: int, stream: Optional[TextIO] = None, enabled: bool = True,
                 interactive: Optional[bool] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.enabled, self.clock = max(int(total), 1), enabled, clock
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = is_terminal(self.stream) if interactive is None else interactive
        self.drawn = 0            # width of the line on the terminal, 0 when none is drawn
        self.last_shown = None    # clock() of the last line shown
        self.last_tenth = -1      # the last 1/LOG_LINES milestone printed

    def _due(self, done: int) -> bool:
        now = self.clock()
        if done >= self.total or self.last_shown is None:
            return True
        if self.interactive:
            return now - self.last_shown >= REDRAW_INTERVAL_S
        return (done * LOG_LINES // self.total > self.last_tenth
                or now - self.last_shown >= LOG_INTERVAL_S)

    def show(self, done: int, text: str) -> None:
        if not self.enabled or not self._due(done):
            return
        self.last_shown = self.clock()
        self.last_tenth = done * LOG_LINES // self.total
        if self.interactive:
            # Pad over the previous, longer line instead of an ANSI erase: any terminal.
            self.stream.write("\r" + text.ljust(self.drawn))
            self.drawn = len(text)
            if done >= self.total:
                self.stream.write("\n")
                self.drawn = 0
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.interactive and self.drawn:
            self.stream.write("\r" + text.ljust(self.drawn) + "\n")
            self.drawn = 0
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Ends a redrawn line left open (a loop stopped before its total)."""
        if self.enabled and self.interactive and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = 0
