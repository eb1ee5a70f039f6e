"""Experiment files: one TOML holding an [experiment] table (name, seeds, the metrics
compared), the base training tables ([run], [data], [model], [train], as in configs/) and
one [[variant]] table per compared method, whose tables are merged over the base. Every
(variant, seed) pair is one subquad-train configuration, checked by train.config."""

import copy
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Sequence

from ..train.config import ConfigError, parse_override, resolve, tomllib

TABLES = ("run", "data", "model", "train")
EXPERIMENT_KEYS = {"name", "seeds", "metrics", "lower_is_better", "out", "description",
                   "paper"}


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

    def run_dir(self, variant: str, seed: int) -> str:
        return os.path.join(self.out, variant, f"seed{seed}")

    def config(self, variant: Variant, seed: int, overrides: Iterable[str] = ()) -> Dict:
        """The checked training configuration of (variant, seed); overrides
        ("table.key=value") apply last, to every variant (the CI's tiny runs)."""
        raw = merge(self.base, variant.tables)
        raw.setdefault("run", {})
        raw["run"]["seed"] = seed
        raw["run"]["out"] = self.run_dir(variant.name, seed)
        for override in overrides:
            table, key, value = parse_override(override)
            raw.setdefault(table, {})[key] = value
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


def load_experiment(path: str, out_root: str = "runs/experiments") -> Experiment:
    """The experiment in the TOML file at `path`; every variant's configuration is checked
    (for seed 0) so that a typo fails before any run starts."""
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"experiment: {path} not found") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"experiment: {path} is not valid TOML ({error})") from None
    unknown = sorted(set(raw) - set(TABLES) - {"experiment", "variant"})
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
    experiment = Experiment(
        name=name, seeds=tuple(seeds), metrics=tuple(metrics),
        lower_is_better=bool(head.get("lower_is_better", True)),
        out=head.get("out", os.path.join(out_root, name)),
        base={t: raw[t] for t in TABLES if t in raw}, variants=tuple(variants),
        paper=head.get("paper", ""), path=path)
    for variant in variants:
        try:
            experiment.config(variant, seeds[0])
        except ConfigError as error:
            raise ConfigError(f"variant {variant.name!r}: {error}") from None
    return experiment
