"""Ctrl-C during a long C++ kernel: the kernel polls Python's signal handlers between its
tasks (python/src/interrupt.cpp), stops, and the call raises KeyboardInterrupt within a
fraction of a second instead of running to its end; the next call runs normally."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import subquad

INTERRUPT_AFTER_S = 0.3


def _interrupted(call):
    """Runs call() with SIGINT sent to this process after INTERRUPT_AFTER_S: the seconds
    until KeyboardInterrupt came out of it."""
    # Python's own handler, even where the process inherited SIGINT ignored (a background
    # job of a non-interactive shell): ignored, the signal would never reach the kernel.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(INTERRUPT_AFTER_S, os.kill, (os.getpid(), signal.SIGINT))
    start = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    return time.perf_counter() - start


def _inputs(n, heads=4, dim=64, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, n, heads, dim)).astype(np.float32) for _ in range(3))


# Calls of about 10 s on one core here (a shared 2-core machine): exact attention over
# N = 32768, and WildCat's pivoted Cholesky of 1024 pivots over one bin of 4096 keys per
# head (a bin is one task: the pivots poll).
LONG_CALLS = {
    "exact": (32768, lambda q, k, v: subquad.exact_attention_forward(q, k, v, threads=1)),
    "wildcat": (4096, lambda q, k, v: subquad.wildcat_attention(q, k, v, rank=1024, bins=1,
                                                                threads=1)),
}


@pytest.mark.parametrize("name", sorted(LONG_CALLS))
def test_ctrl_c_stops_a_long_kernel(name):
    n, call = LONG_CALLS[name]
    q, k, v = _inputs(n)
    seconds = _interrupted(lambda: call(q, k, v))
    assert seconds < INTERRUPT_AFTER_S + 1.0, f"{seconds:.2f} s"
    q, k, v = _inputs(64)
    first, second = call(q, k, v), call(q, k, v)  # the next calls run normally
    for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (first, second))):
        np.testing.assert_array_equal(a, b)


def test_a_signal_handler_that_raises_something_else():
    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        q, k, v = _inputs(LONG_CALLS["exact"][0])
        timer = threading.Timer(INTERRUPT_AFTER_S, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(Stop):
            subquad.exact_attention_forward(q, k, v, threads=1)
        timer.cancel()
    finally:
        signal.signal(signal.SIGINT, previous)
