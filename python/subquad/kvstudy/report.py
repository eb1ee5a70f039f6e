"""The study's page from its records: the pre-registration, the settings chosen on the
tuning documents, coverage (missing cells named), quality per press and ratio (plain and
key-token ΔNLL and KL; retrieval scores where the full cache is calibrated), the primary
comparison with its interval and verdict, the Holm-corrected family of the others, and
cost (compression, decoding, memory). A pilot's page gives no verdicts.
"""

import statistics
from collections import defaultdict
from typing import Dict, List, Optional

from .config import METRICS, StudyConfig
from .runner import (FULL, calibrated, choose_settings, full_task_key, presses_run,
                     task_document, task_groups, task_instances)
from .stats import holm, paired, verdict
from .store import Store

__all__ = ["BEGIN", "END", "expected_cells", "render", "write_page"]

BEGIN, END = "<!-- kvstudy report: begin -->", "<!-- kvstudy report: end -->"
PILOT = "pilot: no verdict"


def _fmt(x, digits=3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def expected_cells(config: StudyConfig, store: Store, choice: Optional[Dict]) -> List[Dict]:
    """The keys of every cell the config asks for that can be known now: all tuning cells;
    evaluation and task cells once the settings are chosen; press cells of a task only
    where its full cache answered (calibration)."""
    c = config
    out = []
    for book, window in c.documents("tune"):
        out.append(dict(phase="tune", task="lm", document=f"{book}/{window}", press=FULL,
                        settings={}, ratio=0.0))
        out += [dict(phase="tune", task="lm", document=f"{book}/{window}", press=p,
                     settings=s, ratio=r) for p in c.presses for r in c.ratios for s in c.grids[p]]
    if choice is None:
        return out
    cells = [(p, choice["settings"][p, r], r) for p in c.presses for r in c.ratios]
    for book, window in c.documents("evaluate"):
        document = f"{book}/{window}"
        out.append(dict(phase="evaluate", task="lm", document=document, press=FULL,
                        settings={}, ratio=0.0))
        out += [dict(phase="evaluate", task="lm", document=document, press=p, settings=s,
                     ratio=r) for p, s, r in cells]
    for kind, haystack, length, depth, seed in task_instances(c):
        document = task_document(haystack, length, depth, seed)
        out.append(full_task_key(kind, haystack, length, depth, seed))
        if presses_run(c, store, kind, haystack, length, depth, seed):
            out += [dict(phase="evaluate", task=kind, document=document, press=p, settings=s,
                         ratio=r) for p, s, r in cells]
    return out


def render(config: StudyConfig, store: Store) -> str:
    c = config
    choice = choose_settings(c, store)
    expected = expected_cells(c, store, choice)
    missing = [k for k in expected if not store.has(**k)]
    cells = [r for r in store.records if r.get("type") == "cell"]
    lines = []
    if c.pilot:
        lines += ["**This is a pilot, not a result.** It checks that the harness runs end to "
                  "end; its numbers are too few to compare presses, and it gives no verdict.", ""]
    cpu = sum(r.get(f) or 0.0 for r in cells for f in
              ("prefill_cpu_s", "compress_cpu_s", "continuation_cpu_s", "short_cpu_s"))
    sessions = [r for r in store.records if r.get("type") == "session"]
    lines += [f"Study `{c.name}`: {len(cells)} cells recorded, {len(expected)} expected now, "
              f"**{len(missing)} missing**; {cpu / 3600:.3f} CPU hours in the measured phases "
              f"(prefill, compression, scoring passes); {len(sessions)} session(s)."]
    if sessions:
        s = sessions[-1]
        lines += ["", f"Last session: {s.get('time')}, commit {s.get('commit')}, {s.get('cpu')} "
                  f"({s.get('cores')} cores), {s.get('threads')} torch thread(s); torch "
                  f"{s.get('torch')}, transformers {s.get('transformers')}, kvpress "
                  f"{s.get('kvpress')}."]
    lines += ["", "### Pre-registered", "", f"- Claim: {c.claim.text}",
              f"- Primary comparison: `{c.claim.press}` against the best of "
              f"{', '.join(f'`{b}`' for b in c.claim.baselines)} (chosen on the tuning "
              f"documents) at r = {c.claim.ratio}, C = {c.claim.context}, `{c.claim.metric}`, "
              f"paired by document, stratified by book, {c.claim.confidence:.0%} t-interval.",
              f"- Rule ({c.claim.rule}, lower is better): reproduced when the interval of "
              f"{c.claim.press} - baseline lies below 0, contradicted when above 0, else no "
              f"difference. Every other comparison of `{c.claim.press}` (each press, ratio "
              f"and metric) is Holm-corrected at family-wise alpha = {c.claim.alpha}."]
    lines += ["", "### Coverage", ""]
    if missing:
        by_group = defaultdict(int)
        for k in missing:
            by_group[k["phase"], k["task"], k["press"], k["ratio"]] += 1
        lines += _table(["phase", "task", "press", "ratio", "missing cells"],
                        [[*g, n] for g, n in sorted(by_group.items(), key=str)])
    else:
        lines += ["Every expected cell is recorded."]
    failed = [r for r in cells if r.get("error")]
    if failed:
        lines += ["", f"{len(failed)} cell(s) recorded a press's failure instead of a value "
                  f"(counted as missing values in the tables):", ""]
        lines += _table(["phase", "task", "document", "press", "ratio", "error"],
                        [[r["phase"], r["task"], r["document"], r["press"], r["ratio"],
                          r["error"][:120]] for r in failed])
    lines += ["", "### Settings chosen on the tuning documents", ""]
    if choice is None:
        lines += ["Not chosen yet: tuning cells are missing (above). Evaluation has not run."]
        return "\n".join(lines) + "\n"
    lines += _table(["press", "ratio", "settings", "tuning mean", "metric", "docs", "chosen"],
                    [[r["press"], r["ratio"], _settings(r["settings"]), _fmt(r["mean"]),
                      r["metric"], r["documents"],
                      "yes" if choice["settings"][r["press"], r["ratio"]] == r["settings"]
                      else ""] for r in choice["tune"]])
    best = choice["best_baseline"]
    lines += ["", f"Best baseline at r = {c.claim.ratio} on the tuning documents: `{best}`."]
    lines += _quality(c, store, choice)
    lines += _comparisons(c, store, choice)
    lines += _retrieval(c, store, choice)
    lines += _cost(c, cells)
    return "\n".join(lines) + "\n"


def _settings(settings: Dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "—"


def _lm_values(c: StudyConfig, store: Store, choice: Dict, press: str, ratio: float,
               metric: str) -> Dict[str, Dict[str, Optional[float]]]:
    """book -> document -> the metric (None: no key tokens); documents without the cell
    are absent."""
    out = defaultdict(dict)
    for book, window in c.documents("evaluate"):
        key = dict(phase="evaluate", task="lm", document=f"{book}/{window}", press=press,
                   settings=choice["settings"][press, ratio], ratio=ratio)
        if store.has(**key):
            out[book][f"{book}/{window}"] = store.get(**key)[metric]
    return out


def _quality(c: StudyConfig, store: Store, choice: Dict) -> List[str]:
    documents = len(c.documents("evaluate"))
    key_counts = [store.get(phase="evaluate", task="lm", document=f"{b}/{w}", press=FULL,
                            settings={}, ratio=0.0)["key_tokens"]
                  for b, w in c.documents("evaluate")
                  if store.has(phase="evaluate", task="lm", document=f"{b}/{w}", press=FULL,
                               settings={}, ratio=0.0)]
    lines = ["", "### Language modelling (evaluation documents)", "",
             f"C = {c.lm.context}, T = {c.lm.continuation} continuation tokens, "
             f"{documents} documents ({', '.join(b.name for b in c.lm.books)}). Key tokens "
             f"per document (short window {c.lm.short_window}, LSD > {c.lm.key_lsd}, LCL > "
             f"{c.lm.key_lcl}): {key_counts}. Mean over documents; `(n/N)` where cells are "
             f"missing or a document has no key token."]
    for metric in METRICS:
        rows = []
        for press in c.presses:
            row = [press]
            for ratio in c.ratios:
                values = [v for book in _lm_values(c, store, choice, press, ratio,
                                                   metric).values() for v in book.values()
                          if v is not None]
                cell = _fmt(statistics.fmean(values)) if values else "missing"
                if values and len(values) < documents:
                    cell += f" ({len(values)}/{documents})"
                row.append(cell)
            rows.append(row)
        lines += ["", f"`{metric}`:", ""] + _table(["press"] + [f"r = {r}" for r in c.ratios],
                                                    rows)
    return lines


def _differences(c, store, choice, press, baseline, ratio, metric):
    ours = _lm_values(c, store, choice, press, ratio, metric)
    theirs = _lm_values(c, store, choice, baseline, ratio, metric)
    return {book: [ours[book][d] - theirs[book][d] for d in ours[book]
                   if d in theirs.get(book, {}) and ours[book][d] is not None
                   and theirs[book][d] is not None] for book in ours}


def _task_differences(c, store, choice, kind, press, baseline, ratio):
    by_haystack = defaultdict(list)
    for k, haystack, length, depth, seed in task_instances(c):
        if k != kind or not calibrated(c, store, kind, haystack, length, depth):
            continue
        document = task_document(haystack, length, depth, seed)
        pair = []
        for p in (press, baseline):
            key = dict(phase="evaluate", task=kind, document=document, press=p,
                       settings=choice["settings"][p, ratio], ratio=ratio)
            if store.has(**key) and store.get(**key)["score"] is not None:
                pair.append(store.get(**key)["score"])
        if len(pair) == 2:
            by_haystack[haystack].append(-(pair[0] - pair[1]))  # lower is better, as ΔNLL
    return by_haystack


def _comparisons(c: StudyConfig, store: Store, choice: Dict) -> List[str]:
    claim, best = c.claim, choice["best_baseline"]
    lines = ["", "### The primary comparison", ""]
    if c.lm.context != claim.context:
        lines += [f"Not read here: the claim is registered at C = {claim.context}, this study "
                  f"runs C = {c.lm.context}.", ""]
    result = paired(_differences(c, store, choice, claim.press, best, claim.ratio,
                                 claim.metric), claim.confidence) if best else None
    if result is not None:
        word = (PILOT if c.pilot else "not tested (context differs)"
                if c.lm.context != claim.context else verdict(result["low"], result["high"]))
        lines += _table(["compared", "r", "metric", "documents (books)", "mean difference",
                         f"{claim.confidence:.0%} interval", "stratified", "verdict"],
                        [[f"{claim.press} - {best}", claim.ratio, claim.metric,
                          f"{result['n']} ({result['strata']})", _fmt(result["mean"], 4),
                          f"[{_fmt(result['low'], 4)}, {_fmt(result['high'], 4)}]",
                          "yes" if result["stratified"] else "no (a book has < 2 documents)",
                          word]])
    family = []
    kinds = c.tasks.kinds if c.tasks else []
    for baseline in c.presses:
        if baseline == claim.press:
            continue
        for ratio in c.ratios:
            for metric in list(METRICS) + [f"{k} score" for k in kinds]:
                if (baseline, ratio, metric) == (best, claim.ratio, claim.metric):
                    continue
                if metric.endswith(" score"):
                    diffs = _task_differences(c, store, choice, metric[:-6], claim.press,
                                              baseline, ratio)
                else:
                    diffs = _differences(c, store, choice, claim.press, baseline, ratio, metric)
                family.append((baseline, ratio, metric, paired(diffs, claim.confidence)))
    tested = [f for f in family if f[3]["p"] is not None]
    adjusted = holm([f[3]["p"] for f in tested])
    lines += ["", f"### The other comparisons of `{claim.press}` (Holm, family of "
              f"{len(tested)}; {len(family) - len(tested)} without two paired values)", "",
              "Differences are press - baseline, lower is better (task scores negated)."]
    rows = []
    for (baseline, ratio, metric, r), p_holm in zip(tested, adjusted):
        if c.pilot:
            word = PILOT
        elif p_holm < claim.alpha:
            word = verdict(r["low"], r["high"])
        else:
            word = "no difference at convergence"
        rows.append([baseline, ratio, metric, r["n"], _fmt(r["mean"], 4),
                     f"[{_fmt(r['low'], 4)}, {_fmt(r['high'], 4)}]", _fmt(r["p"], 4),
                     _fmt(p_holm, 4), word])
    lines += [""] + _table(["baseline", "r", "metric", "n", "mean difference", "interval",
                            "p", "Holm p", "verdict"], rows)
    return lines


def _full_scores(c, store, kind, haystack, length, depth) -> List[float]:
    out = []
    for seed in c.tasks.seeds:
        key = full_task_key(kind, haystack, length, depth, seed)
        if store.has(**key):
            out.append(store.get(**key)["score"])
    return out


def _retrieval(c: StudyConfig, store: Store, choice: Dict) -> List[str]:
    if c.tasks is None:
        return []
    t = c.tasks
    lines = ["", "### Retrieval", "", f"Full-cache calibration (mean score over seeds "
             f"{t.seeds}; a cell enters the comparison at >= {t.calibration_threshold}, and "
             f"the presses run only in calibrated cells, on the instances the full cache "
             f"answers):", ""]
    cells = sorted(task_groups(c), key=str)
    rows = []
    for kind, haystack, length, depth in cells:
        scores = _full_scores(c, store, kind, haystack, length, depth)
        rows.append([kind, haystack, length, "random" if depth is None else depth,
                     _fmt(statistics.fmean(scores), 2) if scores else "missing",
                     len(scores), {True: "yes", False: "no", None: "pending"}[
                         calibrated(c, store, kind, haystack, length, depth)]])
    lines += _table(["task", "haystack", "C", "depth", "full-cache score", "seeds",
                     "calibrated"], rows)
    for kind in t.kinds:
        rows = []
        for press in c.presses:
            row = [press]
            for ratio in c.ratios:
                own = []
                for k, haystack, length, depth, seed in task_instances(c):
                    if k != kind or not calibrated(c, store, kind, haystack, length, depth):
                        continue
                    key = dict(phase="evaluate", task=kind,
                               document=task_document(haystack, length, depth, seed),
                               press=press, settings=choice["settings"][press, ratio],
                               ratio=ratio)
                    if store.has(**key) and store.get(**key)["score"] is not None:
                        own.append(store.get(**key)["score"])
                row.append(f"{statistics.fmean(own):.2f} ({len(own)})" if own else "—")
            rows.append(row)
        lines += ["", f"`{kind}` score over calibrated instances (count):", ""]
        lines += _table(["press"] + [f"r = {r}" for r in c.ratios], rows)
    return lines


def _median(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _cost(c: StudyConfig, cells: List[Dict]) -> List[str]:
    groups = defaultdict(list)
    for r in cells:
        if r["phase"] == "evaluate" and r["press"] != FULL:
            groups[r["press"], r["ratio"]].append(r)
    full = [r for r in cells if r["press"] == FULL and r["task"] == "lm"]
    full_bytes = _median(r["cache_bytes"] for r in full)
    lines = ["", "### Cost (evaluation cells; medians)", "",
             f"Full cache: prefill {_fmt(_median(r['prefill_cpu_s'] for r in full), 2)} CPU s "
             f"(peak {_fmt(_median(r['prefill_peak_mib'] for r in full), 0)} MiB above the "
             f"start), {_fmt(full_bytes and full_bytes / 2**20, 1)} MiB of cache per document "
             f"of C = {c.lm.context}.", ""]
    rows = []
    for (press, ratio), group in sorted(groups.items(), key=str):
        lm = [r for r in group if r["task"] == "lm"]
        tasks = [r for r in group if r["task"] != "lm"]
        cache = _median(r["cache_bytes"] for r in lm)
        rows.append([press, ratio, _fmt(_median(r["kept_per_head"] for r in lm), 1),
                     _fmt(cache and cache / 2**20, 2),
                     _fmt(_median(r["compress_cpu_s"] for r in group), 3),
                     _fmt(_median(r["compress_peak_mib"] for r in group), 1),
                     _fmt(_median(r["continuation_cpu_s"] for r in lm), 2),
                     _fmt(_median(r["decode_cpu_ms_per_token"] for r in tasks), 1)])
    lines += _table(["press", "r", "entries per head", "cache MiB", "compress CPU s",
                     "compress peak MiB", f"scoring {c.lm.continuation} tokens CPU s",
                     "decode CPU ms/token"], rows)
    return lines


def write_page(config: StudyConfig, path: str) -> None:
    """Replaces the text between BEGIN and END in the page at `path` (appends them when
    absent) with the report of the config's records."""
    body = render(config, Store(config.out))
    try:
        with open(path, encoding="utf-8") as handle:
            page = handle.read()
    except FileNotFoundError:
        page = ""
    block = f"{BEGIN}\n{body}{END}"
    if BEGIN in page and END in page:
        page = page[:page.index(BEGIN)] + block + page[page.index(END) + len(END):]
    else:
        page = page + ("\n" if page else "") + block + "\n"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
