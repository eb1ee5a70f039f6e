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


def test_report_has_one_table_per_interpreter_and_family():
    base = {"tokens": 4096, "spread": [90.0, 110.0], "peak_mib": 10.0, "tokens_per_s": 100.0}
    rows = [dict(base, python=python, family=family, size=size, attention=attention)
            for python in ("old/python", "new/python")
            for family, size in (("lm", 256), ("vit", 14))
            for attention in ("torch", "exact")]
    environments = {"old/python": {"torch": "1.13.0", "baseline": "plain matmul-softmax path"},
                    "new/python": {"torch": "2.15.0", "baseline": "SDPA"}}
    text = bench_models.report(rows, environments, 2, 10.0, [1.0, 2.0])
    assert text.count("| model | size | attention |") == 4
    assert "torch 1.13.0 (torch attention = plain matmul-softmax path)" in text
    assert "torch 2.15.0 (torch attention = SDPA)" in text
    assert text.index("LM, torch 1.13.0") < text.index("ViT, torch 1.13.0") < \
        text.index("LM, torch 2.15.0") < text.index("ViT, torch 2.15.0")


def test_describe_torch_names_this_interpreters_torch():
    import sys

    import torch

    found = bench_models.describe_torch(sys.executable)
    assert found["torch"] == torch.__version__
    assert found["baseline"] in ("SDPA", "plain matmul-softmax path")
