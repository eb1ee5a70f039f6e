"""`subquad bench --inputs smollm2` on a tiny captured-workload fixture (the layout
`subquad-llm capture` writes: q.npy [B, N, H, D], k.npy / v.npy [B, N, Hkv, D]): the bench
takes its batch, heads and lengths from the workload, --inputs auto finds it and runs the
approximation rows (with their exact baseline) on it and every other row on Gaussian inputs, and a
missing, corrupt, mis-shaped or non-finite workload, and one whose files are not those its
manifest lists (a re-capture interrupted between files), is a clear error naming the file
and the command that makes it. Usage: cli_workload_test.py PATH_TO_SUBQUAD"""
import hashlib
import os
import subprocess
import sys
import tempfile

import numpy as np

BINARY = sys.argv[1]
TIMEOUT = 120
B, N, H, HKV, D = 2, 300, 4, 2, 8


def run(*args, workload_env=None):
    env = dict(os.environ)
    env.pop("SUBQUAD_WORKLOAD_DIR", None)
    if workload_env is not None:
        env["SUBQUAD_WORKLOAD_DIR"] = workload_env
    return subprocess.run([BINARY, "bench", *args], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT)


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def expect_failure(result, *fragments):
    check(result.returncode == 1, f"expected exit 1, got {result.returncode}: {result.stderr}")
    for fragment in fragments:
        check(fragment in result.stderr, f"expected {fragment!r} in stderr, got: {result.stderr}")


def write_manifest(directory):
    """manifest.txt as `subquad-llm capture` writes it last: "<sha256> <bytes> <file>"."""
    lines = ["# the files of this workload: sha256, bytes, name"]
    for name in ("q.npy", "k.npy", "v.npy"):
        data = open(os.path.join(directory, name), "rb").read()
        lines.append(f"{hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    with open(os.path.join(directory, "manifest.txt"), "w") as handle:
        handle.write("\n".join(lines) + "\n")


def write_workload(directory, q, k, v):
    os.makedirs(directory, exist_ok=True)
    for name, array in (("q", q), ("k", k), ("v", v)):
        np.save(os.path.join(directory, f"{name}.npy"), array)
    write_manifest(directory)


def csv_rows(out_dir):
    lines = open(os.path.join(out_dir, "bench.csv")).read().splitlines()
    header = lines[1].split(",")
    return lines[0], [dict(zip(header, line.split(","))) for line in lines[2:]]


def main():
    rng = np.random.default_rng(0)
    # Peaked attention like a real model's: a few keys with large norms.
    q = rng.standard_normal((B, N, H, D)).astype(np.float32)
    k = rng.standard_normal((B, N, HKV, D)).astype(np.float32)
    k[:, ::37] *= 6
    v = rng.standard_normal((B, N, HKV, D)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "good")
        write_workload(good, q, k, v)
        common = ["--methods", "exact,wildcat,uniform-nystrom", "--reps", "1"]

        # Explicit --inputs smollm2: shape, batch and lengths (256, then N) from the workload.
        out = os.path.join(tmp, "out")
        result = run("--inputs", "smollm2", "--workload", good, "--out-dir", out, *common)
        check(result.returncode == 0, f"bench on the fixture failed: {result.stderr}")
        check("inputs: SmolLM2-135M Q/K/V captured in " + good in result.stdout,
              f"the header names the workload: {result.stdout}")
        meta, rows = csv_rows(out)
        check(meta.endswith("inputs smollm2 " + good), f"csv meta names the inputs: {meta}")
        check(sorted({int(r["tokens"]) for r in rows}) == [256, N], f"lengths from the workload: {rows}")
        for r in rows:
            check((int(r["batch"]), int(r["heads"]), int(r["head_dim"]), int(r["value_dim"])) == (B, H, D, D),
                  f"shape from the workload: {r}")
            check(r["status"] == "measured", f"every row measured: {r}")
        errors = [float(r["relative_error"]) for r in rows if r["method"] != "exact"]
        check(all(0 < e < 2 for e in errors), f"finite, nonzero errors vs exact: {errors}")
        gaussian_note = "NOTE 'rel err' on Gaussian inputs"
        check(gaussian_note not in result.stdout, "no Gaussian-error note on the workload")

        # --inputs auto (the default) picks the workload of $SUBQUAD_WORKLOAD_DIR ...
        out_auto = os.path.join(tmp, "out_auto")
        result = run("--lengths", "256", "--out-dir", out_auto, *common, workload_env=good)
        check(result.returncode == 0 and "captured in " + good in result.stdout,
              f"auto finds the workload: {result.stdout} {result.stderr}")
        # ... and is bit-identical to the explicit run at the same N and seed.
        same = {r["method"]: r["relative_error"] for r in csv_rows(out_auto)[1]}
        check(same == {r["method"]: r["relative_error"] for r in rows if r["tokens"] == "256"},
              "auto and explicit runs agree")
        check({r["inputs"] for r in csv_rows(out_auto)[1]} == {"smollm2"},
              "approximation rows and their baseline on the workload")
        # With a timing row selected, auto runs it (and exact) on Gaussian inputs of the
        # default shapes, and only the approximation rows (and exact) on the workload.
        out_mixed = os.path.join(tmp, "out_mixed")
        result = run("--lengths", "256", "--out-dir", out_mixed, "--methods", "exact,cat,wildcat",
                     "--reps", "1", workload_env=good)
        check(result.returncode == 0 and "approximation rows and their baseline on" in result.stdout
              and "the other rows on standard normal inputs" in result.stdout,
              f"auto splits the rows: {result.stdout} {result.stderr}")
        check(gaussian_note not in result.stdout, "no note when no error is on Gaussian inputs")
        meta, mixed = csv_rows(out_mixed)
        check(meta.endswith("inputs gaussian, approximation rows smollm2 " + good), meta)
        by_inputs = {}
        for r in mixed:
            by_inputs.setdefault(r["inputs"], set()).add((r["method"], int(r["heads"])))
        check(by_inputs == {"gaussian": {("exact", 8), ("cat", 8)},
                            "smollm2": {("exact", H), ("wildcat", H)}},
              f"timing rows Gaussian (default shapes 8x64, 8x128), wildcat on the workload: {mixed}")
        check(sum(r["inputs"] == "gaussian" for r in mixed) == 4, f"two default shapes: {mixed}")
        same_wildcat = [r["relative_error"] for r in mixed if r["method"] == "wildcat"]
        check(same_wildcat == [r["relative_error"] for r in rows
                               if r["tokens"] == "256" and r["method"] == "wildcat"],
              "wildcat's error on the workload as in the explicit run")
        # Explicit --inputs smollm2 still puts every row on the workload.
        result = run("--inputs", "smollm2", "--workload", good, "--lengths", "256", "--out-dir",
                     out_mixed, "--methods", "exact,cat,wildcat", "--reps", "1")
        check(result.returncode == 0, result.stderr)
        check({r["inputs"] for r in csv_rows(out_mixed)[1]} == {"smollm2"}, "all on the workload")
        # ... but an explicit --shapes means Gaussian inputs, and so does an empty folder.
        result = run("--shapes", "2x8", "--lengths", "64", "--out-dir", out_auto, *common,
                     workload_env=good)
        check(result.returncode == 0 and "inputs: standard normal" in result.stdout,
              f"--shapes keeps Gaussian inputs: {result.stdout} {result.stderr}")
        # Errors on Gaussian inputs: the table says, next to its block and after it, why
        # they do not rank the methods, and how to get the real workload.
        check(gaussian_note in result.stdout and "subquad-llm capture" in result.stdout
              and "'rel err' on these inputs does not rank the methods" in result.stdout,
              f"the table explains Gaussian errors: {result.stdout}")
        empty = os.path.join(tmp, "empty")
        result = run("--lengths", "64", "--out-dir", out_auto, *common, workload_env=empty)
        check(result.returncode == 0 and "subquad-llm capture" in result.stdout,
              f"without a workload auto says how to make one: {result.stdout} {result.stderr}")

        # Clear errors.
        expect_failure(run("--inputs", "smollm2", "--workload", empty, *common),
                       empty, "q.npy is missing", "subquad-llm capture --out " + empty)
        expect_failure(run("--inputs", "smollm2", "--workload", good, "--shapes", "2x8", *common),
                       "--shapes")
        expect_failure(run("--inputs", "smollm2", "--workload", good, "--lengths", "512",
                           *common), "--lengths", f"holds {N} tokens")
        expect_failure(run("--inputs", "bogus", *common), "--inputs", "bogus")

        # A re-capture interrupted between files: k.npy of another capture, same shape.
        mixed = os.path.join(tmp, "mixed")
        write_workload(mixed, q, k, v)
        np.save(os.path.join(mixed, "k.npy"), k[:, ::-1].copy())
        expect_failure(run("--inputs", "smollm2", "--workload", mixed, *common),
                       os.path.join(mixed, "k.npy"), "does not match its manifest",
                       "regenerate it with `subquad-llm capture")
        expect_failure(run(*common, workload_env=mixed), "does not match its manifest")
        # Interrupted before the manifest (or captured before manifests): refused too.
        unlisted = os.path.join(tmp, "unlisted")
        write_workload(unlisted, q, k, v)
        os.remove(os.path.join(unlisted, "manifest.txt"))
        expect_failure(run("--inputs", "smollm2", "--workload", unlisted, *common),
                       unlisted, "holds no manifest")

        truncated = os.path.join(tmp, "truncated")
        write_workload(truncated, q, k, v)
        path = os.path.join(truncated, "k.npy")
        with open(path, "r+b") as handle:
            handle.truncate(os.path.getsize(path) - 100)
        expect_failure(run("--inputs", "smollm2", "--workload", truncated, *common),
                       path, "the manifest lists", "regenerate it with `subquad-llm capture")
        # Auto mode does not silently fall back on a corrupt workload either.
        expect_failure(run(*common, workload_env=truncated), path)
        write_manifest(truncated)  # a manifest that agrees: the array itself is refused
        expect_failure(run("--inputs", "smollm2", "--workload", truncated, *common),
                       path, "not a valid workload array", "regenerate it with `subquad-llm capture")

        garbage = os.path.join(tmp, "garbage")
        write_workload(garbage, q, k, v)
        with open(os.path.join(garbage, "v.npy"), "wb") as handle:
            handle.write(b"not an npy file at all")
        write_manifest(garbage)
        expect_failure(run("--inputs", "smollm2", "--workload", garbage, *common), "v.npy")

        cases = {
            "mismatch": (q, k[:, :N - 1], v),                          # N disagrees
            "groups": (q[:, :, :3], k, v),                              # H = 3 over Hkv = 2
            "rank": (q[0], k, v),                                       # rank 3
        }
        for name, arrays in cases.items():
            folder = os.path.join(tmp, name)
            write_workload(folder, *arrays)
            expect_failure(run("--inputs", "smollm2", "--workload", folder, *common),
                           folder, "subquad-llm capture")
        nonfinite = os.path.join(tmp, "nonfinite")
        bad = q.copy()
        bad[1, 5, 2, 3] = np.nan
        write_workload(nonfinite, bad, k, v)
        expect_failure(run("--inputs", "smollm2", "--workload", nonfinite, *common),
                       "q.npy holds non-finite values")
    print("cli_workload_test: ok")


if __name__ == "__main__":
    main()
