"""End-to-end tests of the subquad CLI on .npy files: exact attention against a NumPy
reference, float64 in -> float64 out, the lse output, and clear errors with non-zero exit
codes for bad options, missing files and bad shapes. Usage: cli_test.py PATH_TO_SUBQUAD"""
import os
import subprocess
import sys
import tempfile

import numpy as np

BINARY = sys.argv[1]


def run(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True)


def exact_reference(q, k, v, causal=False):
    b, n, h, d = q.shape
    m, hkv = k.shape[1], k.shape[2]
    group = h // hkv
    out = np.zeros((b, n, h, v.shape[3]))
    lse = np.full((b, h, n), -np.inf)
    for bi in range(b):
        for hi in range(h):
            s = q[bi, :, hi] @ k[bi, :, hi // group].T / np.sqrt(d)
            if causal:
                s = np.where(np.arange(m)[None, :] <= np.arange(n)[:, None] + (m - n), s, -np.inf)
            mx = s.max(axis=1, keepdims=True)
            p = np.exp(s - mx)
            lse[bi, hi] = np.log(p.sum(axis=1)) + mx[:, 0]
            out[bi, :, hi] = (p / p.sum(axis=1, keepdims=True)) @ v[bi, :, hi // group]
    return out, lse


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def bf16_round(x):
    """x rounded to bfloat16 (nearest even), as float64: the upper 16 bits of float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def expect_failure(result, fragment):
    check(result.returncode != 0, f"expected a failure mentioning {fragment!r}, got success")
    check(fragment in result.stderr, f"expected {fragment!r} in stderr, got: {result.stderr}")


def main():
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)
        q = rng.standard_normal((2, 37, 4, 16))
        k = rng.standard_normal((2, 41, 2, 16))
        v = rng.standard_normal((2, 41, 2, 24))
        for name, array in (("q", q), ("k", k), ("v", v)):
            np.save(path(name + "64.npy"), array)
            np.save(path(name + "32.npy"), array.astype(np.float32))

        for causal in (False, True):
            flags = ["--causal"] if causal else []
            result = run("attend", "--method", "exact", "--q", path("q32.npy"), "--k",
                         path("k32.npy"), "--v", path("v32.npy"), "--out", path("out.npy"),
                         "--lse", path("lse.npy"), *flags)
            check(result.returncode == 0, result.stderr)
            out, lse = np.load(path("out.npy")), np.load(path("lse.npy"))
            want_out, want_lse = exact_reference(q, k, v, causal)
            check(out.dtype == np.float32 and out.shape == want_out.shape, "float32 output")
            check(np.abs(out - want_out).max() < 1e-4, "exact attention output differs")
            check(np.abs(lse - want_lse).max() < 1e-4, "lse differs")

        result = run("attend", "--method", "exact", "--q", path("q64.npy"), "--k", path("k64.npy"),
                     "--v", path("v64.npy"), "--out", path("out64.npy"))
        check(result.returncode == 0, result.stderr)
        out64 = np.load(path("out64.npy"))
        check(out64.dtype == np.float64, "float64 inputs give float64 output")
        check(np.abs(out64 - exact_reference(q, k, v)[0]).max() < 1e-12, "float64 accuracy")

        # --dtype bf16: inputs rounded to bfloat16, out holds bfloat16 values (as float32).
        result = run("attend", "--method", "exact", "--q", path("q32.npy"), "--k", path("k32.npy"),
                     "--v", path("v32.npy"), "--out", path("out_bf16.npy"), "--causal",
                     "--dtype", "bf16")
        check(result.returncode == 0, result.stderr)
        out_bf16 = np.load(path("out_bf16.npy"))
        bits = out_bf16.view(np.uint32)
        check(out_bf16.dtype == np.float32 and not np.any(bits & 0xFFFF), "bf16 values")
        rounded = [bf16_round(x) for x in (q, k, v)]
        want = exact_reference(*rounded, causal=True)[0]
        check(np.abs(out_bf16 - want).max() <= 2 ** -7 * np.abs(want).max(), "bf16 output differs")
        expect_failure(run("attend", "--method", "exact", "--q", path("q32.npy"), "--k",
                           path("k32.npy"), "--v", path("v32.npy"), "--out", path("x.npy"),
                           "--dtype", "fp8"), "--dtype")

        common = ["--q", path("q32.npy"), "--k", path("k32.npy"), "--out", path("x.npy")]
        expect_failure(run("attend", "--method", "exact", *common, "--v", path("nope.npy")),
                       "cannot open")
        expect_failure(run("attend", "--method", "exact", *common, "--v", path("v32.npy"),
                           "--bogus"), "unknown option --bogus")
        expect_failure(run("attend", "--method", "nosuch", *common), "unknown --method 'nosuch'")
        expect_failure(run("attend", "--method", "exact", *common), "missing required option --v")
        np.save(path("bad_v.npy"), np.zeros((2, 40, 2, 24), np.float32))
        expect_failure(run("attend", "--method", "exact", *common, "--v", path("bad_v.npy")), "v")
        np.save(path("k3.npy"), np.zeros((2, 41, 3, 16), np.float32))
        np.save(path("v3.npy"), np.zeros((2, 41, 3, 24), np.float32))
        expect_failure(run("attend", "--method", "exact", "--q", path("q32.npy"), "--k",
                           path("k3.npy"), "--v", path("v3.npy"), "--out", path("x.npy")), "Hkv")
        with open(path("trunc.npy"), "wb") as f:
            f.write(open(path("v32.npy"), "rb").read()[:-10])
        expect_failure(run("attend", "--method", "exact", *common, "--v", path("trunc.npy")),
                       "truncated")
        # WildCat's query radius: the default is R_Q = R_K, so a query of outlier norm moves
        # only its own output; with max ||q|| it sets every query's temperature.
        q_outlier = q.astype(np.float32).copy()
        q_outlier[0, 0, 0] *= 40.0
        np.save(path("q_outlier.npy"), q_outlier)
        wildcat = ["attend", "--method", "wildcat", "--rank", "12", "--q", path("q_outlier.npy"),
                   "--k", path("k32.npy"), "--v", path("v32.npy")]
        outputs = {}
        for name, extra in (("default", []), ("keys", ["--query-radius", "keys"]),
                            ("queries", ["--query-radius", "queries"])):
            result = run(*wildcat, *extra, "--out", path(f"wildcat_{name}.npy"))
            check(result.returncode == 0, result.stderr)
            outputs[name] = np.load(path(f"wildcat_{name}.npy"))
        check(np.array_equal(outputs["default"], outputs["keys"]), "--query-radius keys is the default")
        check(not np.allclose(outputs["keys"][0, 1:, 0], outputs["queries"][0, 1:, 0]),
              "--query-radius queries changes the other queries' temperature")
        expect_failure(run(*wildcat, "--query-radius", "max", "--out", path("x.npy")),
                       "option --query-radius: expected keys or queries, got max")
        expect_failure(run("bench", "--lengths", "0"), "--lengths")
        expect_failure(run("bench", "--methods", "nosuch"), "unknown method 'nosuch'")
        expect_failure(run("frobnicate"), "unknown command")

        for args in (["--help"], ["attend", "--help"], ["bench", "--help"]):
            result = run(*args)
            check(result.returncode == 0 and "usage: subquad" in result.stdout, f"help {args}")
        check("--method exact" in run("attend", "--help").stdout, "attend help lists methods")

        result = run("bench", "--methods", "exact", "--lengths", "64,128", "--shapes", "2x16",
                     "--reps", "2", "--out-dir", path("bench"))
        check(result.returncode == 0, result.stderr)
        check("exact" in result.stdout and "GFLOP/s" in result.stdout, "bench table printed")
        csv = open(path("bench/bench.csv")).read().splitlines()
        check(len(csv) == 4 and csv[2].startswith("exact,1,64,2,16,16,1,measured"), "bench csv")
        check(open(path("bench/bench.svg")).read().startswith("<svg"), "bench svg")

        # The FFT rows next to exact, with an odd value dim (the packed bounds pair the last
        # column with zeros) and an odd N (a 7 x 11 grid for circulant2d).
        fft_methods = ["exact", "cat", "fft-lower-bound", "fft-lower-bound-packed", "circulant2d",
                       "circulant2d-fft-bound", "circulant2d-fft-bound-packed"]
        result = run("bench", "--methods", ",".join(fft_methods), "--lengths", "77",
                     "--shapes", "2x8x5", "--reps", "1", "--out-dir", path("bench_fft"))
        check(result.returncode == 0, result.stderr)
        rows = open(path("bench_fft/bench.csv")).read().splitlines()[2:]
        check(sorted(row.split(",")[0] for row in rows) == sorted(fft_methods),
              f"bench rows of the FFT methods: {rows}")
    print("cli end-to-end: all checks passed")


if __name__ == "__main__":
    main()
