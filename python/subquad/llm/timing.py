"""Time and peak memory of prefill, compression and token-by-token decoding per press.

Peak memory is the process's resident-set high-water mark (VmHWM) above its resident size
at the start of each phase: the high-water mark is reset before every phase by writing 5
to /proc/self/clear_refs (Linux), so each phase's peak is its own. Before that, the C
allocator returns its free memory to the system (glibc's malloc_trim), so that a phase
reusing what an earlier one freed still shows its own growth rather than 0. The cache's
own bytes (KVCache.nbytes, exact) are reported next to it. Each phase has its wall time and the
process's CPU time (`time.process_time`): on a shared core the wall time includes the
time other processes ran, the CPU time does not.
"""

import ctypes
import ctypes.util
import time
from typing import Dict, List, Sequence

import torch

from .presses import make_press

__all__ = ["time_presses"]


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _libc_malloc_trim():
    """glibc's malloc_trim, or None (another C library)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _libc_malloc_trim()


class PeakMemory:
    """with PeakMemory() as peak: ...; peak.mib = the resident-set high-water mark above the
    resident size at the start (VmHWM, reset by writing 5 to /proc/self/clear_refs), MiB;
    None where the mark cannot be reset. Also wall and CPU seconds (time.process_time)."""

    def __enter__(self):
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
                handle.write("5")
            self.resettable = True
        except OSError:
            self.resettable = False
        self.start_kib = _status_kib("VmRSS")
        self.seconds, self.cpu_seconds = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.seconds
        self.cpu_seconds = time.process_time() - self.cpu_seconds
        self.mib = (_status_kib("VmHWM") - self.start_kib) / 1024 if self.resettable else None
        return False


@torch.no_grad()
def time_presses(model, ids: Sequence[int], presses: Sequence[str], ratio: float,
                 decode: int) -> Dict:
    """Prefill `ids` once (timed), then for each press: compress a copy and greedily decode
    `decode` tokens one at a time (timed)."""
    cache = model.new_cache(1)
    with PeakMemory() as prefill:
        logits = model.prefill(torch.tensor([list(ids)]), cache)
    result = {"context": len(ids), "ratio": ratio, "decode_tokens": decode,
              "threads": torch.get_num_threads(), "prefill_s": prefill.seconds,
              "prefill_cpu_s": prefill.cpu_seconds,
              "prefill_peak_mib": prefill.mib, "full_cache_bytes": cache.nbytes,
              "presses": []}
    for name in presses:
        press_cache = cache.clone()
        press = make_press(name, 0.0 if name == "none" else ratio)
        with PeakMemory() as compress:
            press(press_cache)
        kept_bytes = press_cache.nbytes
        token = int(logits[0].argmax())
        with PeakMemory() as decoding:
            for _ in range(decode):
                token = int(model.step(torch.tensor([[token]]), press_cache)[0, -1].argmax())
        result["presses"].append({
            "press": name, "compress_s": compress.seconds, "compress_cpu_s": compress.cpu_seconds,
            "compress_peak_mib": compress.mib,
            "decode_s": decoding.seconds, "decode_ms_per_token": 1000 * decoding.seconds / decode,
            "decode_cpu_ms_per_token": 1000 * decoding.cpu_seconds / decode,
            "decode_peak_mib": decoding.mib, "cache_bytes_after_compress": kept_bytes,
            "cache_bytes_after_decode": press_cache.nbytes})
    return result
