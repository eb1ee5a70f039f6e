"""Experiment files: one TOML holding an [experiment] table (name, seeds, the metrics
compared), the base training tables ([run], [data], [model], [train], as in configs/) and
one [[variant]] table per compared method, whose tables are merged over the base. Every
(variant, seed) pair is one subquad-train configuration, checked by train.config.

Files that follow the evidence protocol (docs/specs/evidence-protocol.md) add a [protocol]
table (the learning-rate sweep on the tuning seed, the anchor every run must beat) and
one [[claim]] table per pre-registered comparison (variant against baseline, the rule
that decides it); their `seeds` are the reported seeds, never the tuning seed. A protocol
file with one variant that trains the source models of another study may have no claim
and names that study instead (protocol.source_of: the file that pre-registers what is
tested on its models). A [protocol.gate] table names control variants that must reach a
bound (e.g. 0.4 of the zero predictor's MSE) in every reported seed before any claim is
read."""

import copy
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ..train.config import ConfigError, parse_override, resolve, tomllib

TABLES = ("run", "data", "model", "train")
EXPERIMENT_KEYS = {"name", "seeds", "metrics", "lower_is_better", "out", "description",
                   "paper"}
RULES = ("better", "matches")  # the claim: variant beats baseline / is within the margin
GATE_SPLITS = {"test": "test_", "validation": "val_"}  # split -> prefix of its metrics in a result


@dataclass(frozen=True)
class Claim:
    """A pre-registered comparison of `variant` against `baseline` on the primary metric
    (the first of experiment.metrics, on the test split), paired by seed."""
    text: str
    variant: str
    baseline: str
    rule: str  # "better" or "matches"
    margin: float  # "matches": the largest relative difference still called a match


@dataclass(frozen=True)
class Gate:
    """A precondition read before any claim: every reported seed of each of `variants`
    finished, converged, and its `metric` on `split` (divided by `relative_to`'s, when
    named) is at most (or at least) `bound`. Not a convergence anchor: the compared
    variants still only have to beat the protocol's anchor, so their failure can count."""
    variants: Sequence[str]
    metric: str
    relative_to: Optional[str]
    bound: float
    at_most: bool  # True: value <= bound; False: value >= bound
    split: str = "test"

    def quantity(self) -> str:
        return f"{self.split} {self.metric}" + (f" / {self.relative_to}"
                                                 if self.relative_to else "")

    def rule(self) -> str:
        return f"{self.quantity()} {'<=' if self.at_most else '>='} {self.bound:g}"

    def passes(self, value: float) -> bool:
        return value <= self.bound if self.at_most else value >= self.bound


@dataclass(frozen=True)
class Protocol:
    tuning_seed: int
    lr_factors: Sequence[float]  # x the base lr, tried on the tuning seed
    sweep_fraction: float  # of the training steps, for each sweep run
    sweep_extensions: int  # times the grid grows by 2x when its best lr is at an edge
    anchor: str  # the non-neural anchor (experiments.anchors) every run must beat
    plateau_tolerance: float  # relative improvement over the last quarter still "plateaued"
    claims: Sequence[Claim]
    source_of: Optional[str] = None  # the study that tests these models (no claims here)
    gate: Optional[Gate] = None  # controls that must reach a bound before claims are read


PROTOCOL_DEFAULTS = {"tuning_seed": 0, "lr_factors": [0.5, 1.0, 2.0],
                     "sweep_fraction": 1 / 3, "sweep_extensions": 2,
                     "plateau_tolerance": 0.01}
PROTOCOL_KEYS = set(PROTOCOL_DEFAULTS) | {"anchor", "source_of", "gate"}
CLAIM_KEYS = {"text", "variant", "baseline", "rule", "margin"}
GATE_KEYS = {"variants", "metric", "relative_to", "at_most", "at_least", "split"}


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    tables: Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Experiment:
    name: str
    seeds: Sequence[int]
    metrics: Sequence[str]  # validation metrics reported; the first is the compared one
    lower_is_better: bool
    out: str  # runs/experiments/<name>: run directories and results.jsonl
    base: Mapping[str, Mapping[str, Any]]
    variants: Sequence[Variant]
    paper: str
    path: str
    protocol: Optional[Protocol] = None

    def run_dir(self, variant: str, seed: int) -> str:
        return os.path.join(self.out, variant, f"seed{seed}")

    def sweep_dir(self, variant: str, factor: float) -> str:
        return os.path.join(self.out, "sweep", variant, f"lr{factor:g}")

    def config(self, variant: Variant, seed: int, overrides: Iterable[str] = (),
               lr_factor: Optional[float] = None, sweep: bool = False) -> Dict:
        """The checked training configuration of (variant, seed); overrides
        ("table.key=value") apply last, to every variant (the CI's tiny runs). lr_factor
        scales the learning rate; sweep=True makes it the tuning run of that factor
        (sweep_fraction of the steps, in the sweep's own directory)."""
        raw = merge(self.base, variant.tables)
        raw.setdefault("run", {})
        raw["run"]["seed"] = seed
        raw["run"]["out"] = self.run_dir(variant.name, seed)
        for override in overrides:
            table, key, value = parse_override(override)
            raw.setdefault(table, {})[key] = value
        if lr_factor is not None or sweep:
            train = raw.setdefault("train", {})
            base = resolve(raw)["train"]
            train["lr"] = base["lr"] * (1.0 if lr_factor is None else lr_factor)
            if sweep:
                steps = max(round(self.protocol.sweep_fraction * base["steps"]), 1)
                train["steps"] = steps
                train["warmup"] = min(base["warmup"], steps - 1)
                train["eval_points"] = min(base["eval_points"], steps)
                raw["run"]["out"] = self.sweep_dir(variant.name, lr_factor or 1.0)
        return resolve(raw)

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise ConfigError(f"variant: {name!r} is not in {self.path} (has "
                          f"{[v.name for v in self.variants]})")


def merge(base: Mapping, top: Mapping) -> Dict:
    """base with top's tables merged in (nested tables merged, other values replaced)."""
    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _require(table: Mapping, key: str, types, where: str):
    if key not in table:
        raise ConfigError(f"{where}.{key}: required")
    if not isinstance(table[key], types):
        raise ConfigError(f"{where}.{key}: expected {types}, got {table[key]!r}")
    return table[key]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def load_experiment(path: str, out_root: str = "runs/experiments") -> Experiment:
    """The experiment in the TOML file at `path`; every variant's configuration is checked
    (for seed 0, and under a protocol its sweep run too) so that a typo fails before any
    run starts."""
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"experiment: {path} not found") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"experiment: {path} is not valid TOML ({error})") from None
    unknown = sorted(set(raw) - set(TABLES) - {"experiment", "variant", "protocol", "claim"})
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {unknown}")
    head = raw.get("experiment", {})
    bad = sorted(set(head) - EXPERIMENT_KEYS)
    if bad:
        raise ConfigError(f"experiment: unknown key(s) {bad}; accepted: "
                          f"{sorted(EXPERIMENT_KEYS)}")
    name = _require(head, "name", str, "experiment")
    seeds = _require(head, "seeds", list, "experiment")
    if not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ConfigError(f"experiment.seeds: expected a list of ints >= 0, got {seeds}")
    metrics = _require(head, "metrics", list, "experiment")
    variants: List[Variant] = []
    for index, table in enumerate(raw.get("variant", [])):
        where = f"variant[{index}]"
        vname = _require(table, "name", str, where)
        extra = sorted(set(table) - set(TABLES) - {"name", "label"})
        if extra:
            raise ConfigError(f"{where} ({vname}): unknown key(s) {extra}; a variant holds "
                              f"name, label and the tables {list(TABLES)}")
        if any(v.name == vname for v in variants):
            raise ConfigError(f"{where}: the name {vname!r} is used twice")
        variants.append(Variant(vname, table.get("label", vname),
                                {t: table[t] for t in TABLES if t in table}))
    if not variants:
        raise ConfigError(f"{path}: no [[variant]] tables")
    protocol = load_protocol(raw, [v.name for v in variants], seeds, path)
    experiment = Experiment(
        name=name, seeds=tuple(seeds), metrics=tuple(metrics),
        lower_is_better=bool(head.get("lower_is_better", True)),
        out=head.get("out", os.path.join(out_root, name)),
        base={t: raw[t] for t in TABLES if t in raw}, variants=tuple(variants),
        paper=head.get("paper", ""), path=path, protocol=protocol)
    for variant in variants:
        try:
            experiment.config(variant, seeds[0])
        except ConfigError as error:
            raise ConfigError(f"variant {variant.name!r}: {error}") from None
        if protocol is not None:  # its sweep runs are shorter (e.g. for train.patience)
            try:
                experiment.config(variant, protocol.tuning_seed, lr_factor=1.0, sweep=True)
            except ConfigError as error:
                raise ConfigError(f"variant {variant.name!r}, its learning-rate sweep "
                                  f"({protocol.sweep_fraction:.3g} of the steps): "
                                  f"{error}") from None
    if protocol is not None:
        from .anchors import ANCHOR_NAMES

        family = experiment.config(variants[0], seeds[0])["run"]["family"]
        if protocol.anchor not in ANCHOR_NAMES[family]:
            raise ConfigError(f"protocol.anchor: {protocol.anchor!r} is not an anchor of "
                              f"family {family!r} (has {list(ANCHOR_NAMES[family])})")
    return experiment


def load_protocol(raw: Mapping, variants: Sequence[str], seeds: Sequence[int],
                  path: str) -> Optional[Protocol]:
    """The [protocol] and [[claim]] tables of an experiment file, checked (None when the
    file has neither: an older page's experiment)."""
    if "protocol" not in raw and "claim" not in raw:
        return None
    table = raw.get("protocol")
    if not isinstance(table, Mapping):
        raise ConfigError(f"{path}: [[claim]] tables need a [protocol] table")
    unknown = sorted(set(table) - PROTOCOL_KEYS)
    if unknown:
        raise ConfigError(f"protocol: unknown key(s) {unknown}; accepted: "
                          f"{sorted(PROTOCOL_KEYS)}")
    values = {**PROTOCOL_DEFAULTS, **table}
    anchor = _require(values, "anchor", str, "protocol")
    tuning = values["tuning_seed"]
    if not isinstance(tuning, int) or tuning < 0:
        raise ConfigError(f"protocol.tuning_seed: expected an int >= 0, got {tuning!r}")
    if tuning in seeds:
        raise ConfigError(f"protocol.tuning_seed: {tuning} is also in experiment.seeds "
                          f"{list(seeds)}; the reported seeds must not be the tuning seed")
    factors = values["lr_factors"]
    if (not isinstance(factors, list) or len(factors) < 3 or len(set(factors)) != len(factors)
            or not all(_number(f) and f > 0 for f in factors)):
        raise ConfigError(f"protocol.lr_factors: expected >= 3 distinct numbers > 0, got "
                          f"{factors!r}")
    fraction = values["sweep_fraction"]
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ConfigError(f"protocol.sweep_fraction: expected in (0, 1], got {fraction!r}")
    extensions = values["sweep_extensions"]
    if not isinstance(extensions, int) or not 0 <= extensions <= 4:
        raise ConfigError(f"protocol.sweep_extensions: expected an int in [0, 4], got "
                          f"{extensions!r}")
    tolerance = values["plateau_tolerance"]
    if not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1:
        raise ConfigError(f"protocol.plateau_tolerance: expected in (0, 1), got "
                          f"{tolerance!r}")
    claims = []
    for index, claim in enumerate(raw.get("claim", [])):
        where = f"claim[{index}]"
        extra = sorted(set(claim) - CLAIM_KEYS)
        if extra:
            raise ConfigError(f"{where}: unknown key(s) {extra}; accepted: {sorted(CLAIM_KEYS)}")
        for key in ("variant", "baseline"):
            name = _require(claim, key, str, where)
            if name not in variants:
                raise ConfigError(f"{where}.{key}: {name!r} is not a variant (has {variants})")
        if claim["variant"] == claim["baseline"]:
            raise ConfigError(f"{where}.baseline: expected another variant than the claim's "
                              f"own, got {claim['baseline']!r} for both")
        rule = _require(claim, "rule", str, where)
        if rule not in RULES:
            raise ConfigError(f"{where}.rule: expected one of {list(RULES)}, got {rule!r}")
        margin = claim.get("margin", 0.0)
        if rule == "matches" and (not isinstance(margin, (int, float)) or not 0 < margin < 1):
            raise ConfigError(f"{where}.margin: a 'matches' claim needs a relative margin in "
                              f"(0, 1), got {margin!r}")
        claims.append(Claim(_require(claim, "text", str, where), claim["variant"],
                            claim["baseline"], rule, float(margin)))
    source_of = table.get("source_of")
    if source_of is not None and not (isinstance(source_of, str) and source_of.endswith(".toml")):
        raise ConfigError(f"protocol.source_of: expected the path of the study's .toml file, "
                          f"got {source_of!r}")
    if not claims and source_of is None:
        raise ConfigError(f"{path}: a [protocol] experiment pre-registers at least one "
                          f"[[claim]] (or, training one variant's models for another study, "
                          f"names that study's file in protocol.source_of)")
    if not claims and len(variants) != 1:
        raise ConfigError(f"{path}: without a [[claim]] a [protocol] experiment trains one "
                          f"variant (the source models of protocol.source_of), not "
                          f"{len(variants)}; pre-register the comparison of its variants")
    gate = load_gate(table["gate"], variants) if "gate" in table else None
    if gate is not None and not claims:
        raise ConfigError("protocol.gate: a gate decides whether claims are read; this file "
                          "has no [[claim]]")
    return Protocol(tuning, tuple(float(f) for f in factors), float(fraction), extensions,
                    anchor, float(tolerance), tuple(claims), source_of, gate)


def load_gate(table, variants: Sequence[str]) -> Gate:
    """The [protocol.gate] table, checked."""
    where = "protocol.gate"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table ([protocol.gate] with variants, metric, "
                          f"at_most or at_least), got {table!r}")
    extra = sorted(set(table) - GATE_KEYS)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {extra}; accepted: {sorted(GATE_KEYS)}")
    names = _require(table, "variants", list, where)
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ConfigError(f"{where}.variants: expected a non-empty list of distinct variant "
                          f"names, got {names!r}")
    for name in names:
        if name not in variants:
            raise ConfigError(f"{where}.variants: {name!r} is not a variant (has {variants})")
    metric = _require(table, "metric", str, where)
    relative_to = table.get("relative_to")
    if relative_to is not None and not (isinstance(relative_to, str) and relative_to
                                        and relative_to != metric):
        raise ConfigError(f"{where}.relative_to: expected the name of another recorded metric "
                          f"(the gate reads {metric} / relative_to), got {relative_to!r}")
    bounds = [key for key in ("at_most", "at_least") if key in table]
    if len(bounds) != 1:
        raise ConfigError(f"{where}: expected exactly one of at_most, at_least (a number), "
                          f"got {bounds or 'neither'}")
    bound = table[bounds[0]]
    if not _number(bound):
        raise ConfigError(f"{where}.{bounds[0]}: expected a finite number, got {bound!r}")
    split = table.get("split", "test")
    if split not in GATE_SPLITS:
        raise ConfigError(f"{where}.split: expected one of {list(GATE_SPLITS)}, got {split!r}")
    return Gate(tuple(names), metric, relative_to, float(bound), bounds[0] == "at_most", split)
