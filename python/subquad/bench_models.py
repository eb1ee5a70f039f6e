"""Training throughput of the model families with each attention entry, side by side with
the same model on torch's own attention (SDPA), in one run and one table.

    python -m subquad.bench_models [--python PY ...] [--out FILE.md] [--csv FILE.csv] [--quick]

--python names the interpreters to measure (default: this one), e.g. two environments on
different torch versions; each configuration runs under each of them in turn
(interleaved), all from this source tree, and the report has one table per model family
and interpreter. Each configuration runs in its own process (so its peak memory is
its own): one warm-up
training step (forward, backward, AdamW), then `repetitions` timed steps; tokens/s is
tokens per step over the median step time, the spread is over the min and max step.
Peak memory is the process's resident high-water mark above its resident size just
before the first step (model, optimizer and batch already allocated). torch and the C++
kernels run on one thread; pin the run to one core with taskset for stable numbers.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

from .records import cpu_model

TOKENS_PER_STEP = 4096  # batch = TOKENS_PER_STEP / T: every size does the same work per token
LM_LENGTHS = (256, 1024, 4096)
VIT_GRIDS = (14, 32, 64)
LM_ATTENTIONS = ("exact", "sliding-window", "cat-causal", "mlr", "bilinear-mlr", "btt",
                 "wildcat")
VIT_ATTENTIONS = ("exact", "cat", "cat-avgkey", "circulant2d", "mlr", "bilinear-mlr", "btt",
                  "wildcat")
MODEL = dict(dim=128, heads=4, layers=1)  # head dim 32; one layer keeps the run short
WINDOW = 128  # sliding-window keys
VIT_PATCH = 2
VOCAB = 256


def _memory_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _build(family: str, attention: str, size: int):
    import torch

    from . import models

    options = {attention: {"threads": 1}} if attention != models.TORCH_ATTENTION else {}
    if attention == "sliding-window":
        options[attention]["window"] = WINDOW
    if family == "lm":
        batch = max(TOKENS_PER_STEP // size, 1)
        model = models.CausalLM(VOCAB, size, attention=attention, attention_options=options,
                                **MODEL)
        ids = torch.randint(VOCAB, (batch, size + 1), generator=torch.Generator().manual_seed(0))
        return model, (lambda: model.loss(ids)), batch * size
    tokens = size * size
    batch = max(TOKENS_PER_STEP // tokens, 1)
    model = models.ViTClassifier(size * VIT_PATCH, VIT_PATCH, 1, 10, pool="mean",
                                 attention=attention, attention_options=options, **MODEL)
    images = torch.randn(batch, 1, size * VIT_PATCH, size * VIT_PATCH)
    labels = torch.randint(10, (batch,))
    return model, (lambda: torch.nn.functional.cross_entropy(model(images), labels)), \
        batch * tokens


def measure(family: str, attention: str, size: int, repetitions: int) -> Dict:
    """One configuration in this process: tokens/s of training steps and peak memory."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, loss_of_batch, tokens = _build(family, attention, size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    baseline = _memory_kib("VmRSS")
    times: List[float] = []
    for step in range(repetitions + 1):
        start = time.perf_counter()
        loss = loss_of_batch()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step > 0:  # step 0 warms up (allocations, FFT plans)
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"family": family, "attention": attention, "size": size, "tokens": tokens,
            "torch": torch.__version__,
            "step_s": median, "tokens_per_s": tokens / median,
            "spread": [tokens / max(times), tokens / min(times)],
            "peak_mib": (_memory_kib("VmHWM") - baseline) / 1024}


PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds subquad/
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def child_environment() -> Dict[str, str]:
    """This source tree first on the path (every interpreter measures the same code), and
    one thread for torch's and the BLAS's pools."""
    env = dict(os.environ, **ONE_THREAD)
    env["PYTHONPATH"] = os.pathsep.join(
        [PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def describe_torch(python: str) -> Dict[str, str]:
    """torch's version under `python` and what its attention baseline is."""
    probe = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'sdpa': "
             "hasattr(torch.nn.functional, 'scaled_dot_product_attention')}))")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True,
                          env=child_environment())
    if done.returncode != 0:
        raise SystemExit(f"--python {python}: cannot import torch "
                         f"({done.stderr.strip().splitlines()[-1:]})")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {"torch": found["torch"],
            "baseline": "SDPA" if found["sdpa"] else "plain matmul-softmax path"}


def run_child(family: str, attention: str, size: int, repetitions: int,
              timeout: float, python: str = sys.executable) -> Dict:
    command = [python, "-m", "subquad.bench_models", "--child",
               json.dumps([family, attention, size, repetitions])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=child_environment())
    except subprocess.TimeoutExpired:
        return {"family": family, "attention": attention, "size": size,
                "note": f"over {timeout:.0f} s"}
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit {done.returncode}"
        return {"family": family, "attention": attention, "size": size, "note": reason}
    return json.loads(done.stdout.strip().splitlines()[-1])


def size_label(family: str, size: int) -> str:
    return f"T = {size}" if family == "lm" else f"{size} x {size}"


def table(rows: List[Dict]) -> str:
    """Markdown: one row per (family, size, attention), the torch baseline of the same
    family and size first; ratio = tokens/s over torch's."""
    lines = ["| model | size | attention | batch x tokens | tokens/s (min-max) | "
             "peak MiB | vs torch |", "|---|---|---|---|---|---|---|"]
    baseline = {(r["family"], r["size"]): r for r in rows if r["attention"] == "torch"}
    order: Dict[str, int] = {}
    for name in ("torch",) + LM_ATTENTIONS + VIT_ATTENTIONS:
        order.setdefault(name, len(order))
    rows = sorted(rows, key=lambda r: (r["family"], r["size"], order.get(r["attention"], 99)))
    for row in rows:
        model = "LM" if row["family"] == "lm" else "ViT"
        size = size_label(row["family"], row["size"])
        if "note" in row:
            lines.append(f"| {model} | {size} | {row['attention']} | | n/a: {row['note']} "
                         f"| | |")
            continue
        base = baseline.get((row["family"], row["size"]))
        ratio = ""
        if base is not None and "tokens_per_s" in base and row["attention"] != "torch":
            value = row["tokens_per_s"] / base["tokens_per_s"]
            ratio = f"{value:.2f}x" + (" **slower than torch**" if value < 1 else "")
        low, high = row["spread"]
        per_step = row["tokens"] // row["size"] if row["family"] == "lm" else \
            row["tokens"] // (row["size"] ** 2)
        lines.append(f"| {model} | {size} | {row['attention']} | {per_step} x "
                     f"{row['tokens'] // per_step} | {row['tokens_per_s']:,.0f} "
                     f"({low:,.0f}-{high:,.0f}) | {row['peak_mib']:.0f} | {ratio} |")
    return "\n".join(lines)


def report(rows: List[Dict], environments: Dict[str, Dict[str, str]], repetitions: int,
           seconds: float, load: List[float]) -> str:
    """Markdown: per interpreter, one header line (commit, CPU, torch, conditions) and one
    table per model family."""
    commit = subprocess.run(["git", "-C", PACKAGE_ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    affinity = sorted(os.sched_getaffinity(0))
    parts = []
    for python, environment in environments.items():
        parts.append(
            f"Training throughput (forward + backward + AdamW step), one thread; "
            f"commit {commit}; CPU {cpu_model()}; cores allowed {affinity}; "
            f"`{python}`: torch {environment['torch']} (torch attention = "
            f"{environment['baseline']}); model dim {MODEL['dim']}, {MODEL['heads']} heads, "
            f"{MODEL['layers']} block(s); {TOKENS_PER_STEP} tokens per step; median of "
            f"{repetitions} steps after one warm-up; sliding window {WINDOW}; ViT patch "
            f"{VIT_PATCH}, mean pooling; whole run {seconds:.0f} s over "
            f"{len(environments)} interpreter(s), interleaved; load average {load[0]:.1f} "
            f"at the start, {load[1]:.1f} at the end ({os.cpu_count()} cores).")
        for family, title in (("lm", "LM"), ("vit", "ViT")):
            mine = [r for r in rows if r["python"] == python and r["family"] == family]
            if mine:
                parts.append(f"{title}, torch {environment['torch']}:\n\n" + table(mine))
    return "\n\n".join(parts) + "\n"


def write_csv(path: str, rows: List[Dict], environments: Dict[str, Dict[str, str]]) -> None:
    import csv

    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["python", "torch", "baseline", "family", "attention", "size",
                         "tokens", "step_s", "tokens_per_s", "min_tokens_per_s",
                         "max_tokens_per_s", "peak_mib", "note"])
        for r in rows:
            spread = r.get("spread", ["", ""])
            environment = environments[r["python"]]
            writer.writerow([r["python"], environment["torch"], environment["baseline"],
                             r["family"], r["attention"], r["size"], r.get("tokens", ""),
                             r.get("step_s", ""), r.get("tokens_per_s", ""), spread[0],
                             spread[1], r.get("peak_mib", ""), r.get("note", "")])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the markdown report here (else stdout)")
    parser.add_argument("--csv", help="write the rows as CSV here")
    parser.add_argument("--python", action="append",
                        help="an interpreter to measure under (repeatable; default: this one)")
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=150.0,
                        help="seconds a configuration may take")
    parser.add_argument("--budget", type=float, default=840.0,
                        help="seconds for the whole run; configurations left are not run")
    parser.add_argument("--quick", action="store_true",
                        help="smallest size of each family only (a smoke run)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        family, attention, size, repetitions = json.loads(args.child)
        print(json.dumps(measure(family, attention, size, repetitions)))
        return 0
    if args.repetitions < 1:
        parser.error(f"--repetitions: expected >= 1, got {args.repetitions}")
    pythons = args.python or [sys.executable]
    if len(set(pythons)) != len(pythons):
        parser.error(f"--python: each interpreter once, got {pythons}")
    environments = {python: describe_torch(python) for python in pythons}

    # Smallest sizes first, LM and ViT alternating, so a spent budget cuts the largest;
    # every interpreter runs a configuration before the next one starts (interleaved).
    tiers = list(zip(LM_LENGTHS, VIT_GRIDS))[:1 if args.quick else None]
    plan = [(family, attention, size, python) for lm_length, vit_grid in tiers
            for family, size, attentions in (("lm", lm_length, LM_ATTENTIONS),
                                             ("vit", vit_grid, VIT_ATTENTIONS))
            for attention in ("torch",) + attentions for python in pythons]
    rows, started, load_before = [], time.perf_counter(), os.getloadavg()[0]
    from . import layers

    for family, attention, size, python in plan:
        where = {"family": family, "attention": attention, "size": size, "python": python}
        if attention in layers.names() and not layers.capabilities(attention).backward:
            rows.append(dict(where, note="no backward (inference only)"))
            continue
        left = args.budget - (time.perf_counter() - started)
        if left < 5:
            rows.append(dict(where, note=f"not run (the {args.budget:.0f} s budget was spent)"))
            continue
        row = dict(run_child(family, attention, size, args.repetitions,
                             min(args.timeout, left), python), python=python)
        rows.append(row)
        shown = f"{row['tokens_per_s']:,.0f} tok/s" if "tokens_per_s" in row else row["note"]
        print(f"[{time.perf_counter() - started:6.0f} s] torch "
              f"{environments[python]['torch']} {family} {attention} {size}: {shown}",
              file=sys.stderr, flush=True)
    text = report(rows, environments, args.repetitions, time.perf_counter() - started,
                  [load_before, os.getloadavg()[0]])
    if args.csv:
        write_csv(args.csv, rows, environments)
    if args.out:
        with open(args.out, "w") as file:
            file.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
