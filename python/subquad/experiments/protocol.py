"""The evidence protocol's decisions (docs/specs/evidence-protocol.md): which learning
rate the tuning seed chose, whether a run converged (beats its anchor, plateaued, enough
evaluations), paired differences with t-intervals, McNemar's exact test of two models'
per-example correctness on one test set, the gate on control variants that must be met
before any claim is read, and the verdict of a claim in one of four words."""

import json
import math
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..train.config import ConfigError
from ..train.loop import CONFIG_JSON, config_differences, plateau_reference, saved_config
from ..train.metrics import JSONL, read_rows
from .spec import GATE_SPLITS, Claim, Experiment, Gate

RESULT = "result.json"
MIN_EVALUATIONS = 10  # log-spaced points a curve needs before convergence can be seen
CONFIDENCE = 0.95
REPRODUCED, CONTRADICTED, NO_DIFFERENCE, NOT_TESTED = (
    "reproduced", "contradicted", "no difference at convergence", "not tested")
VERDICTS = (REPRODUCED, CONTRADICTED, NO_DIFFERENCE, NOT_TESTED)


def read_result(directory: str, expected: Optional[Dict] = None) -> Optional[Dict]:
    """The result row of the run in `directory` (None: unfinished). expected: the
    configuration the run must have been made with; a result made with another one raises
    ConfigError naming the keys that differ, rather than stand for the expected run."""
    path = os.path.join(directory, RESULT)
    if not os.path.exists(path):
        return None
    with open(path) as file:
        result = json.load(file)
    if expected is not None:
        made_with = run_config(directory, result)
        changed = (["its configuration (no config in result.json, no config.json)"]
                   if made_with is None else config_differences(made_with, expected))
        if changed:
            raise ConfigError(f"{directory}: its result was made with another configuration "
                              f"({'; '.join(changed)}); move the directory away to run it "
                              f"again, or run with the configuration it was made with")
    return result


def run_config(directory: str, result: Optional[Dict] = None) -> Optional[Dict]:
    """The configuration the run in `directory` was made with: the one its result stores,
    else its config.json (the trainer writes one in every run directory; results written
    before they stored their configuration have only that); None without either."""
    result = result if result is not None else read_result(directory)
    if result is not None and "config" in result:
        return saved_config(os.path.join(directory, RESULT), result["config"])
    path = os.path.join(directory, CONFIG_JSON)
    if not os.path.exists(path):
        return None
    with open(path) as file:
        return saved_config(path, json.load(file))


def better(a: float, b: float, lower_is_better: bool) -> bool:
    return a < b if lower_is_better else a > b


# --- the learning-rate sweep on the tuning seed ------------------------------------------

@dataclass(frozen=True)
class SweepState:
    """The tuning seed's runs of one variant: metric per finished lr factor (inf: the run
    diverged), the factors still to run, and the chosen factor once none are left."""
    scores: Mapping[float, float]
    pending: Sequence[float]
    chosen: Optional[float]


def sweep_state(experiment: Experiment, variant: str) -> SweepState:
    """The sweep of `variant`: the configured factors, then, while the best finished
    factor is at an edge of those run, the next factor 2x beyond it (at most
    sweep_extensions times)."""
    protocol, metric = experiment.protocol, experiment.metrics[0]
    factors = sorted(protocol.lr_factors)
    scores: Dict[float, float] = {}
    for _ in range(protocol.sweep_extensions + 1):
        pending = []
        for factor in factors:
            result = read_result(experiment.sweep_dir(variant, factor))
            if result is None:
                pending.append(factor)
            elif factor not in scores:
                scores[factor] = (math.inf if experiment.lower_is_better else -math.inf) \
                    if result.get("diverged") else result[f"val_{metric}"]
        if pending:
            return SweepState(scores, pending, None)
        best = min(scores, key=lambda f: scores[f] if experiment.lower_is_better
                   else -scores[f])
        if best == factors[-1]:
            factors.append(best * 2)
        elif best == factors[0]:
            factors.insert(0, best / 2)
        else:
            return SweepState(scores, [], best)
    return SweepState(scores, [], best)  # the grid's edge after every extension


# --- convergence ---------------------------------------------------------------------------

def validation_curve(directory: str) -> List[Dict]:
    path = os.path.join(directory, JSONL)
    if not os.path.exists(path):
        return []
    return [row for row in read_rows(path) if row["split"] == "validation"]


def early_stop_text(stopping: Mapping) -> str:
    """"early stop at step N (best N')" for a run that early stopping ended, else ""."""
    if not stopping.get("stopped_early"):
        return ""
    return f"early stop at step {stopping['stopped_at']} (best {stopping['best_step']})"


def convergence(curve: Sequence[Mapping], steps: int, metric: str, anchor: float,
                lower_is_better: bool, tolerance: float,
                early_stop: Optional[Mapping] = None) -> Dict:
    """The protocol's test of one run from its validation curve: the primary metric of
    the weights it reports (the last evaluation's; with early stopping, early_stop =
    Trainer.early_stopping(), the best one's) beats the anchor; the loss improved by less
    than `tolerance` (relative) over the last quarter of the steps, or early stopping
    ended the run (its patience ran out: plateaued by the protocol's section 3); at least
    MIN_EVALUATIONS evaluation points."""
    if not curve:
        return {"converged": False, "beats_anchor": False, "plateaued": False,
                "evaluations": 0, "reason": "no evaluations"}
    last = curve[-1]
    reported = last
    if early_stop and early_stop.get("best_step") is not None:
        reported = next((row for row in curve if row["step"] == early_stop["best_step"]),
                        last)
    reference_step = plateau_reference(steps)
    earlier = [row for row in curve if row["step"] <= reference_step]
    improvement = ((earlier[-1]["loss"] - last["loss"]) / abs(earlier[-1]["loss"])
                   if earlier and last["step"] > earlier[-1]["step"] else math.nan)
    beats = better(reported[metric], anchor, lower_is_better)
    stopped = early_stop_text(early_stop or {})
    plateaued = bool(stopped) or improvement < tolerance  # nan (no reference) is False
    enough = len(curve) >= MIN_EVALUATIONS
    reasons = [text for ok, text in (
        (beats, f"{metric} {reported[metric]:.4g} does not beat the anchor's {anchor:.4g}"),
        (plateaued, f"loss still improving: {improvement:.2%} over the last quarter"),
        (enough, f"{len(curve)} evaluations (< {MIN_EVALUATIONS})")) if not ok]
    if stopped:  # said even when it converged: the plateau is the early stop's
        reasons.append(f"plateaued: early stopping ended it ({stopped})")
    return {"converged": beats and plateaued and enough, "beats_anchor": beats,
            "plateaued": plateaued, "early_stopped": bool(stopped),
            "last_quarter_improvement": improvement, "evaluations": len(curve),
            "anchor": anchor, "reason": "; ".join(reasons)}


def converged(row: Mapping) -> bool:
    return bool(row.get("convergence", {}).get("converged"))


# --- the gate ------------------------------------------------------------------------------

def gate_value(gate: Gate, row: Mapping) -> Tuple[Optional[float], str]:
    """(the gated quantity of one result, ""), or (None, why it has none)."""
    prefix = GATE_SPLITS[gate.split]
    for name in (gate.metric, gate.relative_to):
        if name is not None and not isinstance(row.get(prefix + name), (int, float)):
            return None, f"no {prefix}{name} in its result"
    value = row[prefix + gate.metric]
    if gate.relative_to is None:
        return value, ""
    if row[prefix + gate.relative_to] == 0:
        return None, f"its {prefix}{gate.relative_to} is 0"
    return value / row[prefix + gate.relative_to], ""


def gate_outcome(gate: Gate, rows: Mapping[Tuple[str, int], Mapping], seeds: Sequence[int]
                 ) -> Dict:
    """Whether `gate` is met by the results `rows` ((variant, seed) -> result): every seed
    of every gate variant finished, converged and within the bound. checks: one per
    (variant, seed) with its value (None when unfinished or unrecorded) and whether it
    passes; reason: every failure, for the verdicts' "gate not met: ..."."""
    checks, failures = [], []
    for variant in gate.variants:
        for seed in seeds:
            row = rows.get((variant, seed))
            value, missing = gate_value(gate, row) if row is not None else (None, "unfinished")
            within = value is not None and gate.passes(value)
            ok = within and converged(row)
            name = f"{variant} seed {seed}"
            if row is None or value is None:
                failures.append(f"{name} {missing}")
            elif not within:
                failures.append(f"{name}: {gate.quantity()} {value:.4g} "
                                f"{'>' if gate.at_most else '<'} {gate.bound:g}")
            if row is not None and not converged(row):
                reason = row.get("convergence", {}).get("reason") or "diverged"
                failures.append(f"{name} did not converge ({reason})")
            checks.append({"variant": variant, "seed": seed, "value": value,
                           "finished": row is not None, "within": within,
                           "converged": row is not None and converged(row), "passes": ok})
    return {"met": not failures, "reason": "; ".join(failures), "checks": checks}


# --- paired statistics and verdicts ------------------------------------------------------

def t_interval(values: Sequence[float], confidence: float = CONFIDENCE
               ) -> Tuple[float, float, float]:
    """(mean, low, high): Student's t-interval of the mean of `values` (n >= 2)."""
    from scipy import stats

    n = len(values)
    if n < 2:
        raise ValueError(f"t_interval: expected >= 2 values, got {n}")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> Dict[str, float]:
    """McNemar's exact test of two classifiers on the same examples, in the same order:
    only_a (a right, b wrong) and only_b, the discordant pairs; under "equally accurate"
    each discordant pair falls either way with probability 1/2, so p is the two-sided
    exact binomial p-value min(1, 2 P(X <= min(only_a, only_b))), X ~ Bin(only_a + only_b,
    1/2) (1 when there are no discordant pairs)."""
    if len(correct_a) != len(correct_b):
        raise ValueError(f"mcnemar: expected the same examples, got {len(correct_a)} and "
                         f"{len(correct_b)} outcomes")
    only_a = sum(1 for a, b in zip(correct_a, correct_b) if a and not b)
    only_b = sum(1 for a, b in zip(correct_a, correct_b) if b and not a)
    n = only_a + only_b
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1))
    return {"only_a": only_a, "only_b": only_b, "discordant": n,
            "p": min(1.0, 2 * tail / 2 ** n)}


def paired_relative(variant: Mapping[int, float], baseline: Mapping[int, float]
                    ) -> Dict[int, float]:
    """Per seed both have: variant / baseline - 1 (the relative difference)."""
    return {seed: variant[seed] / baseline[seed] - 1 for seed in sorted(variant)
            if seed in baseline}


def decide(claim: Claim, differences: Mapping[int, float], lower_is_better: bool,
           not_converged: Sequence[str]) -> Dict:
    """The verdict of `claim` from the paired relative differences of its converged
    seeds. better: reproduced when the interval lies wholly on the claimed side of 0,
    contradicted when wholly on the other, else no difference. matches: reproduced when
    the interval lies inside +-margin, contradicted when wholly outside it, else no
    difference (the page says the interval is wider than the margin)."""
    if not_converged:
        return {"verdict": NOT_TESTED, "reason": "did not converge: " + ", ".join(not_converged)}
    if len(differences) < 2:
        return {"verdict": NOT_TESTED,
                "reason": f"{len(differences)} paired seed(s); an interval needs 2"}
    mean, low, high = t_interval(list(differences.values()))
    row = {"mean": mean, "low": low, "high": high, "seeds": len(differences)}
    if claim.rule == "better":
        claimed_side = high < 0 if lower_is_better else low > 0
        other_side = low > 0 if lower_is_better else high < 0
        verdict = REPRODUCED if claimed_side else CONTRADICTED if other_side else NO_DIFFERENCE
        reason = {REPRODUCED: "the interval excludes 0 on the claimed side",
                  CONTRADICTED: "the interval excludes 0 on the other side",
                  NO_DIFFERENCE: "the interval contains 0"}[verdict]
    else:
        inside = -claim.margin < low and high < claim.margin
        outside = low > claim.margin or high < -claim.margin
        verdict = REPRODUCED if inside else CONTRADICTED if outside else NO_DIFFERENCE
        reason = {REPRODUCED: f"the interval lies within +-{claim.margin:.0%}",
                  CONTRADICTED: f"the interval lies outside +-{claim.margin:.0%}",
                  NO_DIFFERENCE: f"the interval is wider than +-{claim.margin:.0%}: "
                                 f"neither a match nor a difference is shown"}[verdict]
    return {"verdict": verdict, "reason": reason, **row}


# --- anchors -----------------------------------------------------------------------------

ANCHORS_JSON = "anchors.json"


def experiment_anchors(experiment: Experiment) -> Dict[str, Dict[str, Dict[str, float]]]:
    """anchor name -> split -> metrics of the experiment's task (experiments.anchors),
    computed once and kept in <out>/anchors.json with the data settings they were
    computed for (recomputed when those change)."""
    from .anchors import for_config

    config = experiment.config(experiment.variants[0], experiment.seeds[0])
    settings = {"family": config["run"]["family"], "data": config["data"]}
    path = os.path.join(experiment.out, ANCHORS_JSON)
    if os.path.exists(path):
        with open(path) as file:
            saved = json.load(file)
        if saved.get("settings") == settings:
            return saved["anchors"]
    anchors: Dict[str, Dict[str, Dict[str, float]]] = {}
    for split in ("validation", "test"):
        for name, metrics in for_config(config, split).items():
            anchors.setdefault(name, {})[split] = metrics
    if experiment.protocol is not None and experiment.protocol.anchor not in anchors:
        raise ValueError(f"protocol.anchor: {experiment.protocol.anchor!r} is not an anchor "
                         f"of this task (has {sorted(anchors)})")
    os.makedirs(experiment.out, exist_ok=True)
    temporary = path + f".{os.getpid()}.tmp"
    with open(temporary, "w") as file:
        json.dump({"settings": settings, "anchors": anchors}, file, indent=1)
    os.replace(temporary, path)
    return anchors
