"""The study's statistics: paired differences over documents, stratified by book (equal
weight per book, Welch-Satterthwaite degrees of freedom), Student t-intervals and
two-sided p-values (the exact sign test where the differences have no spread), Holm's
step-down correction, and the verdict in the evidence protocol's four words
(subquad.experiments.protocol).
"""

import math
from typing import Dict, List, Mapping, Sequence

from scipy import stats as scipy_stats

from ..experiments.protocol import CONTRADICTED, NO_DIFFERENCE, NOT_TESTED, REPRODUCED

__all__ = ["holm", "paired", "verdict"]


def holm(pvalues: Sequence[float]) -> List[float]:
    """Holm-adjusted p-values, in the given order: the i-th smallest p becomes
    max over j <= i of min(1, (m - j + 1) p_(j)) (j from 1)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def paired(differences: Mapping[str, Sequence[float]], confidence: float = 0.95) -> Dict:
    """The mean paired difference with its t-interval and two-sided p-value (H0: mean 0).
    differences: stratum (book) -> the documents' differences. With two or more documents
    in every stratum: stratified (each stratum weighs equally; variance sum w^2 s^2 / n;
    Welch-Satterthwaite df); else the documents pooled ("stratified": False)."""
    strata = {k: list(v) for k, v in differences.items() if len(v)}
    n = sum(len(v) for v in strata.values())
    if n < 2:
        return {"n": n, "strata": len(strata), "mean": None, "low": None, "high": None,
                "p": None, "stratified": False}
    if len(strata) > 1 and all(len(v) >= 2 for v in strata.values()):
        w = 1.0 / len(strata)
        mean = sum(w * _mean(v) for v in strata.values())
        parts = [w * w * _var(v) / len(v) for v in strata.values()]
        var = sum(parts)
        df = var * var / sum(p * p / (len(v) - 1) for p, v in zip(parts, strata.values())
                             ) if var > 0 else float(n - len(strata))
        stratified = True
    else:
        pooled = [x for v in strata.values() for x in v]
        mean, var, df, stratified = _mean(pooled), _var(pooled) / n, float(n - 1), False
    se = math.sqrt(var)
    half = scipy_stats.t.ppf(0.5 + confidence / 2, df) * se
    if se > 0:
        p = 2 * scipy_stats.t.sf(abs(mean) / se, df)
    else:
        p = _sign_test([x for v in strata.values() for x in v])
    return {"n": n, "strata": len(strata), "mean": mean, "low": mean - half,
            "high": mean + half, "p": float(p), "df": df, "stratified": stratified}


def _sign_test(differences: Sequence[float]) -> float:
    """Two-sided exact sign test (ties dropped). Used where every stratum's differences are
    equal: the t statistic is then undefined, not infinite, and reading it as p = 0 would
    decide five tied retrieval instances (p = 2 / 2^5 = 0.0625 here) at any Holm level."""
    above = sum(1 for x in differences if x > 0)
    below = sum(1 for x in differences if x < 0)
    if above + below == 0:
        return 1.0
    return float(scipy_stats.binomtest(above, above + below, 0.5).pvalue)


def verdict(low, high, lower_is_better: bool = True) -> str:
    """"better" claims: reproduced when the interval of (claimed - baseline) lies wholly on
    the claimed side of 0, contradicted when wholly on the other side, else no difference;
    not tested without an interval."""
    if low is None or high is None:
        return NOT_TESTED
    if lower_is_better:
        return REPRODUCED if high < 0 else CONTRADICTED if low > 0 else NO_DIFFERENCE
    return REPRODUCED if low > 0 else CONTRADICTED if high < 0 else NO_DIFFERENCE


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _var(values: Sequence[float]) -> float:
    m = _mean(values)
    return sum((x - m) ** 2 for x in values) / (len(values) - 1)
