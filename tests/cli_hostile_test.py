"""The subquad CLI on hostile input: every failure exits 1 with a message naming the option,
never a signal, a hang, exit 2 or a partial file. Thread counts out of range, directories and
devices as inputs, full disks as outputs, zero-volume inputs with gigantic sides, outputs too
large to allocate, and every method under an address-space limit (RLIMIT_AS).
Usage: cli_hostile_test.py PATH_TO_SUBQUAD"""
import os
import resource
import signal
import struct
import subprocess
import sys
import tempfile

import numpy as np

BINARY = sys.argv[1]
TIMEOUT = 30  # seconds: a hang fails the test instead of the CI run


def run(*args, address_limit=None, file_limit=None):
    def limits():
        if address_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_limit, address_limit))
        if file_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    return subprocess.run([BINARY, "attend", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, preexec_fn=limits)


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def expect_error(result, *fragments):
    """Exit 1 (not a signal, not 2) with every fragment in the message."""
    check(result.returncode == 1,
          f"expected exit 1, got {result.returncode}; stderr: {result.stderr}")
    for fragment in fragments:
        check(fragment in result.stderr, f"expected {fragment!r} in stderr: {result.stderr}")


def npy_header_only(path, shape, descr="<f4"):
    """A .npy file with `shape` in its header and no data (valid when the volume is 0)."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    header = header.encode() + b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    with open(path, "wb") as file:
        file.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)


def main():
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)
        small = rng.standard_normal((1, 8, 2, 4)).astype(np.float32)
        np.save(path("q.npy"), small)
        exact = ["--method", "exact", "--q", path("q.npy"), "--k", path("q.npy"),
                 "--v", path("q.npy")]

        # Thread counts: one accepted range, 2^32 + 1 is not narrowed to 1.
        for threads in ("4294967297", "100000", "-1", "1025"):
            expect_error(run(*exact, "--out", path("o.npy"), "--threads", threads),
                         "option --threads", "expected 0 (all cores) to 1024")
        check(run(*exact, "--out", path("o.npy"), "--threads", "1024").returncode == 0,
              "1024 threads (clamped to the cores) must run")

        # Inputs that are not regular files: refused before anything is read.
        expect_error(run("--method", "exact", "--q", tmp, "--k", path("q.npy"), "--v",
                         path("q.npy"), "--out", path("o.npy")), "option --q", "is a directory")
        expect_error(run("--method", "exact", "--q", "/dev/zero", "--k", path("q.npy"), "--v",
                         path("q.npy"), "--out", path("o.npy")), "option --q",
                     "not a regular file")

        # Outputs: a full device, a full file system (RLIMIT_FSIZE), a directory.
        expect_error(run(*exact, "--out", "/dev/full"), "option --out", "write failed")
        expect_error(run(*exact, "--out", path("o2.npy"), "--lse", "/dev/full"), "option --lse",
                     "write failed")
        before = set(os.listdir(tmp))
        expect_error(run(*exact, "--out", path("partial.npy"), file_limit=100), "option --out",
                     "write failed")
        check(set(os.listdir(tmp)) == before, "a partial or temporary output file was left")
        expect_error(run(*exact, "--out", tmp), "option --out", "is a directory")

        # Zero-volume inputs with gigantic other sides return at once.
        huge = 999999999999999999
        npy_header_only(path("z0.npy"), (huge, 0, 3))
        npy_header_only(path("v0.npy"), (huge, 0, 3, 2))
        npy_header_only(path("q0.npy"), (huge, 0, 3, 4))
        for method, inputs in (("cat", ["--z", "z0.npy", "--v", "v0.npy"]),
                               ("cat-causal", ["--z", "z0.npy", "--v", "v0.npy"]),
                               ("cat-avgkey", ["--q", "q0.npy", "--k", "q0.npy", "--v", "v0.npy"]),
                               ("exact", ["--q", "q0.npy", "--k", "q0.npy", "--v", "v0.npy"])):
            args = [arg if not arg.endswith(".npy") else path(arg) for arg in inputs]
            result = run("--method", method, *args, "--out", path("zero_out.npy"))
            check(result.returncode == 0, f"{method} on zero volume: {result.stderr}")
            with open(path("zero_out.npy"), "rb") as file:  # NumPy refuses such shapes
                np.lib.format.read_magic(file)
                shape = np.lib.format.read_array_header_1_0(file)[0]
            check(0 in shape, f"{method}: expected a zero-volume output, got {shape}")

        # An output too large to allocate: exit 1 naming it (q [1, 8, 1, 16], v [1, 0, 1, 4e9]).
        np.save(path("q1.npy"), rng.standard_normal((1, 8, 1, 16)).astype(np.float32))
        npy_header_only(path("k_empty.npy"), (1, 0, 1, 16))
        npy_header_only(path("v_wide.npy"), (1, 0, 1, 4000000000))
        expect_error(run("--method", "exact", "--q", path("q1.npy"), "--k", path("k_empty.npy"),
                         "--v", path("v_wide.npy"), "--out", path("o.npy")),
                     "cannot allocate", "--out")

        # Options accepted silently before.
        qkv = ["--q", path("q.npy"), "--k", path("q.npy"), "--v", path("q.npy")]
        expect_error(run("--method", "mlr", *qkv, "--ranks", "2,2,", "--out", path("o.npy")),
                     "option --ranks", "empty item")
        for scale in ("0", "-1"):
            expect_error(run("--method", "cat-avgkey", *qkv, "--scale", scale, "--out",
                             path("o.npy")), "scale")
            expect_error(run("--method", "exact", *qkv, "--scale", scale, "--out",
                             path("o.npy")), "scale")

        address_limit_sweep(path, rng)
    print("cli hostile tests passed")


def address_limit_sweep(path, rng):
    """Every method under address-space limits from too small to enough: each run either
    succeeds or exits 1 with an out-of-memory message, never a signal or libgomp's exit."""
    n, h, d = 4096, 8, 32
    q = rng.standard_normal((1, n, h, d)).astype(np.float32)
    np.save(path("big_q.npy"), q)
    np.save(path("big_z.npy"), rng.standard_normal((1, n, h)).astype(np.float32))
    np.save(path("grid.npy"), q.reshape(1, 64, 64, h, d))
    qkv = ["--q", path("big_q.npy"), "--k", path("big_q.npy"), "--v", path("big_q.npy")]
    methods = {
        "exact": qkv + ["--causal"],
        "cat": ["--z", path("big_z.npy"), "--v", path("big_q.npy")],
        "cat-causal": ["--z", path("big_z.npy"), "--v", path("big_q.npy")],
        "cat-avgkey": qkv,
        "circulant2d": ["--q", path("grid.npy"), "--k", path("grid.npy"), "--v", path("grid.npy")],
        "mlr": qkv + ["--ranks", "16,16", "--causal"],
        "wildcat": qkv + ["--rank", "64"],
    }
    mib = 1 << 20
    # The footprint of the process itself (shared libraries, OpenMP, the allocator) depends
    # on the machine: find the smallest limit under which a tiny problem runs, then probe the
    # methods just above it, where their inputs, outputs and workspaces no longer fit.
    tiny = ["--method", "exact", "--q", path("q.npy"), "--k", path("q.npy"), "--v",
            path("q.npy"), "--out", path("tiny.npy"), "--threads", "2"]
    low, high = 16 * mib, 1024 * mib  # runs at `high`
    while high - low > 4 * mib:
        middle = (low + high) // 2
        if run(*tiny, address_limit=middle).returncode == 0:
            high = middle
        else:
            low = middle
    footprint = high
    for method, args in methods.items():
        outcomes = []
        for limit in (footprint + 4 * mib, footprint + 16 * mib, footprint + 48 * mib,
                      footprint + 96 * mib, 4096 * mib):
            result = run("--method", method, *args, "--out", path("limited.npy"), "--threads",
                         "2", address_limit=limit)
            check(result.returncode in (0, 1),
                  f"{method} under {limit // mib} MiB: exit {result.returncode}: {result.stderr}")
            if result.returncode == 1:
                check("out of memory" in result.stderr and "libgomp" not in result.stderr,
                      f"{method} under {limit // mib} MiB: {result.stderr}")
            outcomes.append(result.returncode)
        check(outcomes[0] == 1, f"{method}: 4 MiB above the footprint should not be enough "
                                f"({outcomes})")
        check(outcomes[-1] == 0, f"{method}: 4 GiB should be enough ({outcomes})")


if __name__ == "__main__":
    main()
