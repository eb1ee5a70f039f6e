"""subquad.bench_models: one configuration measures positive throughput and memory, and
the table marks an entry slower than torch's attention."""

import pytest

pytest.importorskip("torch")
from subquad import bench_models  # noqa: E402


def test_measure_reports_throughput_and_memory():
    row = bench_models.measure("lm", "exact", 32, repetitions=1)
    assert row["tokens"] == bench_models.TOKENS_PER_STEP
    assert row["tokens_per_s"] > 0 and row["step_s"] > 0 and row["peak_mib"] >= 0


def test_table_flags_slower_than_torch():
    base = {"family": "vit", "size": 14, "tokens": 3920, "spread": [90.0, 110.0],
            "peak_mib": 10.0}
    rows = [dict(base, attention="torch", tokens_per_s=100.0),
            dict(base, attention="cat", tokens_per_s=50.0),
            dict(base, attention="exact", tokens_per_s=150.0),
            {"family": "vit", "size": 14, "attention": "wildcat", "note": "no backward"}]
    text = bench_models.table(rows)
    assert "| cat | 20 x 196 | 50 (90-110) | 10 | 0.50x **slower than torch** |" in text
    assert "| exact | 20 x 196 | 150 (90-110) | 10 | 1.50x |" in text
    assert "n/a: no backward" in text
