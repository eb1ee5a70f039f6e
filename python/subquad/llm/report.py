"""Tables and plots of the KV-compression protocol from its result files.

Reads a results folder (written by subquad-llm): perplexity.jsonl, model-checks.json,
timing.json / timing-c<C>.json, passkey.jsonl, press-c<C>.jsonl, and notes.md (hand-written prose placed
first). Writes the markdown page and, beside it, PNG plots of each score against the
compression ratio per press (95% percentile-bootstrap CIs over documents). A folder that is
missing or holds no result file, or a result file that does not parse, is an error, and the
page is replaced only once the new one is complete.
"""

import contextlib
import glob
import json
import os
import re
from collections import defaultdict
from typing import Dict, List, Sequence

import numpy as np

from .evaluation import bootstrap_ci

METRICS = [("delta_nll", "ΔNLL (nats/token)"), ("ppl_ratio", "perplexity ratio"),
           ("kl", "KL(full ‖ press) (nats)"), ("top1", "top-1 agreement")]


def read_jsonl(path: str, fields: Sequence[str] = ()) -> List[Dict]:
    """The records of a JSONL file; a line that is not a JSON object holding `fields` is a
    ValueError naming the file and the line."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                raise ValueError(f"{path}: line {number}: not a JSON record ({error})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {number}: not a JSON record (a "
                                 f"{type(record).__name__})")
            missing = [field for field in fields if field not in record]
            if missing:
                raise ValueError(f"{path}: line {number}: a record without "
                                 f"{', '.join(map(repr, missing))} (the file of another "
                                 f"command?)")
            records.append(record)
    return records


def _jsonl(path: str) -> List[Dict]:
    return read_jsonl(path) if os.path.exists(path) else []


def _per_run(records: List[Dict]):
    """(press, ratio) -> metric -> per-document values (same document order)."""
    table = defaultdict(lambda: defaultdict(list))
    for record in records:
        for run in record["runs"]:
            cell = table[(run["press"], run["ratio"])]
            for metric in ("delta_nll", "kl", "top1", "kept_per_head", "bytes_per_block"):
                cell[metric].append(run[metric])
            cell["doc"].append(record["doc"])
    return table


def _ci(values, metric):
    if metric == "ppl_ratio":  # exp of the mean ΔNLL: the ratio of the perplexities
        mean, low, high = bootstrap_ci(values)
        return np.exp(mean), np.exp(low), np.exp(high)
    return bootstrap_ci(values)


def _fmt(ci, digits=3):
    mean, low, high = ci
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _text_of(record: Dict) -> str:
    return record.get("text") or "persuasion"  # records before --texts held Persuasion only


def _windows(records: List[Dict], length: int) -> str:
    """Which windows of which texts the documents are, e.g. "persuasion windows 0-25,
    mobydick windows 0-23 (of 4352 tokens each, consecutive and non-overlapping)"."""
    by_text = defaultdict(list)
    for record in records:
        by_text[_text_of(record)].append(record.get("window", record["doc"]))
    parts = []
    for text, windows in by_text.items():
        windows = sorted(windows)
        runs, start = [], windows[0]  # maximal runs of consecutive windows
        for previous, window in zip(windows, windows[1:] + [None]):
            if window is None or window != previous + 1:
                runs.append(f"{start}" if start == previous else f"{start}-{previous}")
                start = window
        parts.append(f"{text} windows {', '.join(runs)}")
    return "; ".join(parts) + f" (windows of {length} tokens each, consecutive and " \
        "non-overlapping from the text's first token)"


def _press_section(path: str, out_dir: str, lines: List[str]) -> None:
    records = _jsonl(path)
    if not records:
        return
    context = records[0]["context"]
    table = _per_run(records)
    presses = list(dict.fromkeys(press for press, _ in table))  # in the order they ran
    ratios = sorted({ratio for _, ratio in table})
    full_nll = np.mean([r["full_nll"] for r in records])
    continuation = records[0]["continuation"]
    lines += [f"### C = {context}, {continuation} continuation tokens: {len(records)} documents", "",
              f"Prefill {context} tokens, compress, teacher-force the next "
              f"{records[0]['continuation']}. Full-cache mean NLL {full_nll:.4f} nats/token "
              f"(perplexity {np.exp(full_nll):.2f}); full cache {records[0]['full_bytes_per_block']}"
              f" bytes per block. Mean [95% bootstrap CI] over documents.", "",
              f"Documents: {_windows(records, context + continuation)}.", ""]
    for metric, label in METRICS:
        source = "delta_nll" if metric == "ppl_ratio" else metric
        lines += [f"**{label}**", "", "| press | " + " | ".join(f"r = {r}" for r in ratios) + " |",
                  "|---|" + "---|" * len(ratios)]
        for press in presses:
            cells = [_fmt(_ci(table[(press, r)][source], metric)) if (press, r) in table else "-"
                     for r in ratios]
            lines.append(f"| {press} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["**Entries kept per KV head / bytes kept per block**", "",
              "| press | " + " | ".join(f"r = {r}" for r in ratios) + " |",
              "|---|" + "---|" * len(ratios)]
    for press in presses:
        cells = [f"{table[(press, r)]['kept_per_head'][0]} / {table[(press, r)]['bytes_per_block'][0]}"
                 for r in ratios]
        lines.append(f"| {press} | " + " | ".join(cells) + " |")
    lines += ["", "**Winner per ratio** (lowest mean ΔNLL; the paired difference to the "
              "runner-up over the same documents, 95% bootstrap CI):", ""]
    for ratio in ratios:
        ranked = sorted(presses, key=lambda p: np.mean(table[(p, ratio)]["delta_nll"]))
        best, second = ranked[0], ranked[1]
        diff = np.asarray(table[(second, ratio)]["delta_nll"]) - np.asarray(
            table[(best, ratio)]["delta_nll"])
        ci = bootstrap_ci(diff)
        verdict = "significant" if ci[1] > 0 else "not significant (CI includes 0)"
        lines.append(f"- r = {ratio}: **{best}** (ΔNLL {np.mean(table[(best, ratio)]['delta_nll']):.4f}),"
                     f" then {second}; {second} - {best} = {_fmt(ci, 4)}: {verdict}. Order: "
                     + " < ".join(ranked) + ".")
    lines.append("")
    if "compresskv" in presses:
        others = [p for p in presses if p != "compresskv"]
        lines += ["**CompressKV against each press**: paired ΔNLL(other) - ΔNLL(compresskv) "
                  "over the same documents, mean [95% bootstrap CI]; > 0 means CompressKV is "
                  "better.", "", "| other | " + " | ".join(f"r = {r}" for r in ratios) + " |",
                  "|---|" + "---|" * len(ratios)]
        for other in others:
            cells = [_fmt(bootstrap_ci(np.asarray(table[(other, r)]["delta_nll"]) - np.asarray(
                table[("compresskv", r)]["delta_nll"])), 4) for r in ratios]
            lines.append(f"| {other} | " + " | ".join(cells) + " |")
        lines.append("")
    # press-c1024.jsonl -> kv-compression-c1024.png, press-c1024-t256.jsonl -> ...-c1024-t256.png
    stem = os.path.splitext(os.path.basename(path))[0].replace("press-", "", 1)
    plot = os.path.join(out_dir, f"kv-compression-{stem}.png")
    texts = ", ".join(dict.fromkeys(_text_of(r).capitalize() for r in records))
    _plot(table, presses, ratios, f"{context}, {continuation} continuation tokens",
          len(records), plot, texts)
    lines += [f"![scores against ratio, C = {context}, T = {continuation}]"
              f"(kv-compression/{os.path.basename(plot)})", ""]


def _plot(table, presses, ratios, context, docs, path, texts):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for axis, (metric, label) in zip(axes, METRICS):
        source = "delta_nll" if metric == "ppl_ratio" else metric
        for press in presses:
            cis = np.array([_ci(table[(press, r)][source], metric) for r in ratios])
            axis.errorbar(ratios, cis[:, 0], yerr=[cis[:, 0] - cis[:, 1], cis[:, 2] - cis[:, 0]],
                          marker="o", capsize=3, label=press)
        axis.set_xlabel("compression ratio (fraction removed)")
        axis.set_title(label)
        if metric in ("delta_nll", "kl", "ppl_ratio"):
            axis.set_yscale("log" if metric == "kl" else "linear")
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle(f"SmolLM2-135M-Instruct, {texts}, C = {context}, {docs} documents, "
                    f"95% bootstrap CIs")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def _passkey_section(path: str, out_dir: str, lines: List[str]) -> None:
    records = _jsonl(path)
    if not records:
        return
    cells = defaultdict(list)
    for record in records:
        cells[(record["length"], record["depth"])].append(record)
    lengths = sorted({length for length, _ in cells})
    depths = sorted({depth for _, depth in cells})
    lines += ["### Passkey: full-cache calibration", "",
              f"{len(records)} prompts; exact match of the key (greedy). Cells: length "
              f"(target tokens) x depth; entries are correct / prompts.", "",
              "| length | " + " | ".join(f"depth {d:g}" for d in depths) + " |",
              "|---|" + "---|" * len(depths)]
    calibrated = []
    for length in lengths:
        row = []
        for depth in depths:
            group = cells.get((length, depth), [])
            correct = sum(r["full_correct"] for r in group)
            row.append(f"{correct}/{len(group)}" if group else "-")
            if group and correct / len(group) >= 0.9:
                calibrated.append((length, depth))
        lines.append(f"| {length} | " + " | ".join(row) + " |")
    seeds = defaultdict(set)
    for record in records:
        seeds[record["length"]].add(record["seed"])
    lines += ["", "Seeds per length (not every cell of a length has them all): " + ", ".join(
        f"{length}: {len(seeds[length])}" for length in lengths) + ".", ""]
    lines += [f"Calibrated cells (full cache >= 90%): {len(calibrated)} of {len(cells)}: "
              + ", ".join(f"({l}, {d:g})" for l, d in calibrated) + ".", ""]
    if not calibrated:
        return
    # The presses' runs: on the calibration prompts themselves, and (passkey-presses.jsonl,
    # written by `passkey --cells-from`) on prompts of the calibrated cells run after a
    # full-cache-only calibration (`passkey --full-only`).
    press_records = defaultdict(list)
    for record in records + _jsonl(os.path.join(os.path.dirname(path), "passkey-presses.jsonl")):
        if record["runs"] or record.get("presses_skipped"):
            press_records[(record["length"], record["depth"])].append(record)
    score = defaultdict(list)
    for key in calibrated:
        for record in press_records[key]:
            for run in record["runs"]:
                score[(run["press"], run["ratio"])].append(run["correct"])
    if not score:
        lines += ["No press has run in the calibrated cells yet.", ""]
        return
    presses = list(dict.fromkeys(p for p, _ in score))
    ratios = sorted({r for _, r in score})
    skipped = sum(bool(r.get("presses_skipped")) for key in calibrated for r in press_records[key])
    scored_seeds = defaultdict(set)
    for key in calibrated:
        for record in press_records[key]:
            if record["runs"]:
                scored_seeds[key[0]].add(record["seed"])
    lines += ["### Passkey exact match in the calibrated cells", "",
              "Correct / prompts scored" + (
                  f"; {skipped} prompt(s) of the calibrated cells that the full cache missed ran "
                  "no press (`--skip-presses-on-miss`), so the presses are scored where the "
                  "full cache finds the key" if skipped else "") + ". Seeds with press runs, "
              "per length: " + ", ".join(f"{length}: {len(scored_seeds[length])}"
                                         for length in sorted(scored_seeds)) + ".", "",
              "| press | " + " | ".join(f"r = {r}" for r in ratios) + " |",
              "|---|" + "---|" * len(ratios)]
    for press in presses:
        lines.append(f"| {press} | " + " | ".join(
            f"{sum(score[(press, r)])}/{len(score[(press, r)])}" for r in ratios) + " |")
    lines.append("")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for press in presses:
        axis.plot(ratios, [np.mean(score[(press, r)]) for r in ratios], marker="o", label=press)
    axis.set_xlabel("compression ratio (fraction removed)")
    axis.set_ylabel("passkey exact match")
    axis.set_title(f"Passkey, {len(calibrated)} calibrated cells")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    plot = os.path.join(out_dir, "kv-compression-passkey.png")
    figure.savefig(plot, dpi=90)
    plt.close(figure)
    lines += [f"![passkey against ratio](kv-compression/{os.path.basename(plot)})", ""]


def _timing_context(path: str) -> int:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["context"]


def _timing_section(path: str, lines: List[str]) -> None:
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as handle:
        t = json.load(handle)
    lines += [f"### Time and peak memory, C = {t['context']}", "",
              f"Context {t['context']} tokens, r = {t['ratio']}, {t['threads']} torch thread, "
              f"greedy decoding of {t['decode_tokens']} tokens one at a time. Prefill "
              f"{t['prefill_s']:.2f} s, peak resident memory +{t['prefill_peak_mib']:.0f} MiB "
              f"over the loaded model; full cache {t['full_cache_bytes'] / 2**20:.1f} MiB. "
              "Peak memory = the resident-set high-water mark above the phase's start "
              "(reset per phase); memory the allocator already holds does not show, so the "
              "exact cache bytes are the columns to compare (a KVCache grows its storage by "
              "doubling, hence the bytes after decoding).", "",
              "| press | compress (s) | decode (ms/token) | decode peak (MiB) | cache after "
              "compress (MiB) | cache after decode (MiB) |", "|---|---|---|---|---|---|"]
    cpu = "prefill_cpu_s" in t  # CPU times: recorded since they were added to timing.py
    if cpu:
        lines[-4] += (f" CPU time of the process (what other processes' share of the core "
                      f"does not inflate): prefill {t['prefill_cpu_s']:.2f} s; in the table, "
                      "wall / CPU.")

    def both(press, wall, cpu_key, digits):  # "wall / CPU", or the wall time alone
        text = f"{press[wall]:.{digits}f}"
        return text + f" / {press[cpu_key]:.{digits}f}" if cpu else text

    for p in t["presses"]:
        lines.append(f"| {p['press']} | {both(p, 'compress_s', 'compress_cpu_s', 3)} | "
                     f"{both(p, 'decode_ms_per_token', 'decode_cpu_ms_per_token', 1)} | "
                     f"{p['decode_peak_mib']:.1f} | {p['cache_bytes_after_compress'] / 2**20:.2f} | "
                     f"{p['cache_bytes_after_decode'] / 2**20:.2f} |")
    lines.append("")


def _workload_section(path: str, lines: List[str]) -> None:
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as handle:
        rows = json.load(handle)
    blocks = sorted({r["block"] for r in rows})
    ranks = sorted({r["rank"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(r["block"], r["method"], r["rank"]): r for r in rows}
    lines += ["### WildCat on real attention (the model's Q/K/V)", "",
              "Relative Frobenius error of `subquad.wildcat_attention` (one bin) against exact "
              "non-causal attention over the same post-RoPE q, k, v of a block (all 9 heads), "
              "mean over 3 seeds (spread max - min in parentheses).", ""]
    for block in blocks:
        lines += [f"**block {block}**", "", "| method | " + " | ".join(f"r = {r}" for r in ranks)
                  + " |", "|---|" + "---|" * len(ranks)]
        for method in methods:
            lines.append(f"| {method} | " + " | ".join(
                f"{by[(block, method, r)]['rel_error']:.3f} ({by[(block, method, r)]['spread']:.2f})"
                for r in ranks) + " |")
        lines.append("")


@contextlib.contextmanager
def _reading(path: str):
    """Errors while a result file is read and tabulated name the file."""
    try:
        yield
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    except (KeyError, TypeError, IndexError, AttributeError) as error:
        raise ValueError(f"{path}: not a result file of subquad-llm ({type(error).__name__}: "
                         f"{error})") from None


RESULT_FILES = ("perplexity.jsonl", "timing*.json", "press-c*.jsonl", "passkey.jsonl",
                "attention-workload.json")


def write_report(results: str, out: str) -> None:
    if not os.path.isdir(results):
        raise ValueError(f"--results {results}: no such directory")
    found = [path for pattern in RESULT_FILES for path in glob.glob(os.path.join(results, pattern))]
    if not found:
        raise ValueError(f"--results {results}: no result files (expected some of "
                         f"{', '.join(RESULT_FILES)}); {out} is left as it is")
    out_dir = os.path.join(os.path.dirname(os.path.abspath(out)), "kv-compression")
    os.makedirs(out_dir, exist_ok=True)
    lines: List[str] = []
    notes = os.path.join(results, "notes.md")
    if os.path.exists(notes):
        with open(notes, encoding="utf-8") as handle:
            lines += [handle.read().rstrip(), ""]
    lines += ["## Measured tables (generated by `subquad-llm report`)", ""]
    perplexity = os.path.join(results, "perplexity.jsonl")
    with _reading(perplexity):
        for record in _jsonl(perplexity):
            lines += [f"**Perplexity** (llama-perplexity protocol, n_ctx {record['n_ctx']}, "
                      f"{record['chunks']} chunks, second half of each scored: "
                      f"{record['scored_tokens']} tokens of {record['text']}): "
                      f"**{record['perplexity']:.3f}** (NLL {record['nll']:.4f}).", ""]
    # timing.json and timing-c<C>.json: a section each, in order of context length.
    timings = glob.glob(os.path.join(results, "timing*.json"))
    for path in timings:
        with _reading(path):
            _timing_context(path)
    for path in sorted(timings, key=_timing_context):
        with _reading(path):
            _timing_section(path, lines)
    for path in sorted(glob.glob(os.path.join(results, "press-c*.jsonl")),
                       key=lambda p: int(re.search(r"c(\d+)", p).group(1))):
        with _reading(path):
            _press_section(path, out_dir, lines)
    for path, section in ((os.path.join(results, "passkey.jsonl"),
                           lambda path: _passkey_section(path, out_dir, lines)),
                          (os.path.join(results, "attention-workload.json"),
                           lambda path: _workload_section(path, lines))):
        with _reading(path):
            section(path)
    # Written aside and renamed: a failure on the way leaves the old page whole.
    with open(out + ".partial", "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines).rstrip() + "\n")
    os.replace(out + ".partial", out)
