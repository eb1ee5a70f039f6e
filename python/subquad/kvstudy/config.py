"""The study's TOML file: what runs (texts, presses, ratios, tasks) and what was registered
before the runs (the claim, the primary comparison, the decision rule).

    [study]   name, out (the records' folder), pilot (no verdicts), threads, seed
    [claim]   text, press, baselines, ratio, context, metric, rule ("better"), confidence,
              alpha (family-wise, Holm)
    [lm]      context, continuation, short_window, short_chunk, key_lsd, key_lcl, score_chunk,
              [[lm.book]] name, tune = [windows], evaluate = [windows]
    [presses] names, ratios, [presses.grid] press = { setting = [values] }
    [tasks]   kinds, haystacks, lengths, depths, seeds, keys, values, hops,
              calibration_threshold, skip_on_miss
"""

import tomllib
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

from .presses import PRESSES, settings_grid
from .tasks import KINDS
from .texts import TEXTS

__all__ = ["Book", "Claim", "LMConfig", "METRICS", "StudyConfig", "TaskConfig", "load"]

METRICS = ("key_delta_nll", "key_kl", "delta_nll", "kl")  # lower is better, all four


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Book:
    name: str
    tune: List[int]  # windows that choose the presses' settings
    evaluate: List[int]  # windows of the reported comparison (disjoint from tune)


@dataclass(frozen=True)
class LMConfig:
    context: int
    continuation: int
    short_window: int
    short_chunk: int
    key_lsd: float
    key_lcl: float
    books: List[Book]
    score_chunk: int = 64  # continuation tokens per teacher-forced forward


@dataclass(frozen=True)
class TaskConfig:
    kinds: List[str]
    haystacks: List[str]
    lengths: List[int]
    depths: List[float]
    seeds: List[int]
    keys: int = 4
    values: int = 4
    hops: int = 4
    calibration_threshold: float = 0.9
    skip_on_miss: bool = True  # presses run only where the full cache answers (calibration)


@dataclass(frozen=True)
class Claim:
    text: str
    press: str
    baselines: List[str]
    ratio: float
    context: int  # the primary comparison is read at this lm.context only
    metric: str
    rule: str
    confidence: float
    alpha: float  # family-wise error rate of the Holm-corrected comparisons


@dataclass(frozen=True)
class StudyConfig:
    name: str
    out: str
    pilot: bool
    threads: int
    seed: int
    claim: Claim
    lm: LMConfig
    presses: List[str]
    ratios: List[float]
    grids: Dict[str, List[Dict]]  # press -> its settings grid
    tasks: Optional[TaskConfig]
    source: Mapping = field(default_factory=dict, repr=False)

    def documents(self, phase: str) -> List[tuple]:
        """(book, window) pairs of the phase ("tune" or "evaluate")."""
        return [(b.name, w) for b in self.lm.books for w in getattr(b, phase)]


def _need(table: Mapping, key: str, where: str):
    if key not in table:
        raise ConfigError(f"{where}.{key}: missing")
    return table[key]


def _positive_int(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a positive integer, got {value!r}")
    return value


def parse(data: Mapping) -> StudyConfig:
    study = _need(data, "study", "")
    claim_table = _need(data, "claim", "")
    lm_table = _need(data, "lm", "")
    press_table = _need(data, "presses", "")
    names = list(_need(press_table, "names", "presses"))
    for name in names:
        if name not in PRESSES:
            raise ConfigError(f"presses.names: {name!r} is not a press (have {sorted(PRESSES)})")
    ratios = [float(r) for r in _need(press_table, "ratios", "presses")]
    if not ratios or any(not 0 < r < 1 for r in ratios):
        raise ConfigError(f"presses.ratios: expected fractions in (0, 1), got {ratios}")
    overrides = press_table.get("grid", {})
    for name in overrides:
        if name not in names:
            raise ConfigError(f"presses.grid.{name}: not among presses.names")
    grids = {n: settings_grid(n, overrides.get(n)) for n in names}
    books = []
    for i, book in enumerate(_need(lm_table, "book", "lm")):
        name = _need(book, "name", f"lm.book[{i}]")
        if name not in TEXTS:
            raise ConfigError(f"lm.book[{i}].name: expected one of {sorted(TEXTS)}, got {name!r}")
        tune, evaluate = list(book.get("tune", [])), list(_need(book, "evaluate", f"lm.book[{i}]"))
        if set(tune) & set(evaluate):
            raise ConfigError(f"lm.book[{i}]: windows {sorted(set(tune) & set(evaluate))} are "
                              f"both tuning and evaluation documents")
        books.append(Book(name, tune, evaluate))
    lm = LMConfig(_positive_int(_need(lm_table, "context", "lm"), "lm.context"),
                  _positive_int(_need(lm_table, "continuation", "lm"), "lm.continuation"),
                  _positive_int(_need(lm_table, "short_window", "lm"), "lm.short_window"),
                  _positive_int(_need(lm_table, "short_chunk", "lm"), "lm.short_chunk"),
                  float(lm_table.get("key_lsd", 2.0)), float(lm_table.get("key_lcl", -2.0)),
                  books, _positive_int(lm_table.get("score_chunk", 64), "lm.score_chunk"))
    if lm.short_window > lm.context:
        raise ConfigError(f"lm.short_window: {lm.short_window} is more than lm.context")
    claim = Claim(str(_need(claim_table, "text", "claim")), _need(claim_table, "press", "claim"),
                  list(_need(claim_table, "baselines", "claim")),
                  float(_need(claim_table, "ratio", "claim")),
                  _positive_int(_need(claim_table, "context", "claim"), "claim.context"),
                  _need(claim_table, "metric", "claim"), claim_table.get("rule", "better"),
                  float(claim_table.get("confidence", 0.95)),
                  float(claim_table.get("alpha", 0.05)))
    for press in [claim.press] + claim.baselines:
        if press not in names:
            raise ConfigError(f"claim: press {press!r} is not among presses.names")
    if claim.metric not in METRICS:
        raise ConfigError(f"claim.metric: expected one of {METRICS}, got {claim.metric!r}")
    if claim.ratio not in ratios:
        raise ConfigError(f"claim.ratio: {claim.ratio} is not among presses.ratios")
    if claim.rule != "better":
        raise ConfigError(f"claim.rule: only 'better' is implemented, got {claim.rule!r}")
    tasks = None
    if "tasks" in data:
        t = data["tasks"]
        tasks = TaskConfig(list(_need(t, "kinds", "tasks")), list(_need(t, "haystacks", "tasks")),
                           [int(x) for x in _need(t, "lengths", "tasks")],
                           [float(x) for x in _need(t, "depths", "tasks")],
                           [int(x) for x in _need(t, "seeds", "tasks")],
                           int(t.get("keys", 4)), int(t.get("values", 4)), int(t.get("hops", 4)),
                           float(t.get("calibration_threshold", 0.9)),
                           bool(t.get("skip_on_miss", True)))
        for kind in tasks.kinds:
            if kind not in KINDS:
                raise ConfigError(f"tasks.kinds: expected some of {KINDS}, got {kind!r}")
        for name in tasks.haystacks:
            if name not in TEXTS:
                raise ConfigError(f"tasks.haystacks: expected some of {sorted(TEXTS)}, got "
                                  f"{name!r}")
    return StudyConfig(str(_need(study, "name", "study")), str(_need(study, "out", "study")),
                       bool(study.get("pilot", False)), int(study.get("threads", 1)),
                       int(study.get("seed", 0)), claim, lm, names, ratios, grids, tasks, data)


def load(path: str) -> StudyConfig:
    with open(path, "rb") as handle:
        return parse(tomllib.load(handle))
