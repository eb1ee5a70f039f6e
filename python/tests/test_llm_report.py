"""subquad-llm report: tables, winners and plots from result records."""

import json

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("torch")

from subquad.llm.report import write_report  # noqa: E402


def _record(doc, offsets):
    runs = [{"press": press, "ratio": ratio, "kept_per_head": int(100 * (1 - ratio)),
             "bytes_per_block": 1000, "delta_nll": offset * ratio + 0.001 * doc,
             "kl": offset * ratio, "top1": 1 - offset * ratio}
            for press, offset in offsets.items() for ratio in (0.25, 0.75)]
    return {"context": 100, "continuation": 8, "doc": doc, "full_nll": 3.0,
            "full_bytes_per_block": 2000, "runs": runs}


def test_report_writes_tables_winners_and_plots(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    with open(results / "press-c100.jsonl", "w") as handle:
        for doc in range(6):
            handle.write(json.dumps(_record(doc, {"knorm": 0.5, "snapkv": 0.1})) + "\n")
    (results / "notes.md").write_text("# Title\n")
    out = tmp_path / "page.md"
    write_report(str(results), str(out))
    text = out.read_text()
    assert text.startswith("# Title")
    assert "### C = 100, 8 continuation tokens: 6 documents" in text
    assert "| snapkv | 0.028 [" in text  # 0.1 * 0.25 + mean(0.001 * doc)
    assert "- r = 0.75: **snapkv**" in text and "significant." in text
    assert (tmp_path / "kv-compression" / "kv-compression-c100.png").stat().st_size > 1000
