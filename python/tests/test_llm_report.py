"""subquad-llm report: tables, winners and plots from result records."""

import json
import os

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
            handle.write(json.dumps(_record(doc, {"nystrom": 0.5, "compresskv": 0.1})) + "\n")
    (results / "notes.md").write_text("# Title\n")
    out = tmp_path / "page.md"
    write_report(str(results), str(out))
    text = out.read_text()
    assert text.startswith("# Title")
    assert "### C = 100, 8 continuation tokens: 6 documents" in text
    assert "| compresskv | 0.028 [" in text  # 0.1 * 0.25 + mean(0.001 * doc)
    assert "- r = 0.75: **compresskv**" in text and "significant." in text
    assert (tmp_path / "kv-compression" / "kv-compression-c100.png").stat().st_size > 1000


def test_report_renders_records_of_retired_presses(tmp_path):
    """The records of docs/results/kv-compression name subquad.llm's retired scorer
    presses: the report reads press names from the records, so they still render."""
    results = tmp_path / "results"
    results.mkdir()
    records = [_record(doc, {"snapkv": 0.1, "compresskv": 0.5}) for doc in range(3)]
    (results / "press-c100.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_report(str(results), str(tmp_path / "page.md"))
    text = (tmp_path / "page.md").read_text()
    assert "| snapkv | 0.026 [" in text and "- r = 0.75: **snapkv**" in text
    assert "| other | r = 0.25 | r = 0.75 |" in text  # CompressKV against snapkv


def test_passkey_report_scores_presses_from_both_files(tmp_path):
    results = tmp_path / "results"
    results.mkdir()

    def record(length, depth, seed, full, runs=(), **extra):
        return {"length": length, "depth": depth, "seed": seed, "full_correct": full,
                "runs": [{"press": p, "ratio": r, "correct": c} for p, r, c in runs], **extra}

    calibration = [record(1024, 0.0, 0, True, [("nystrom", 0.5, True)])]
    calibration += [record(1024, 0.0, s, True, full_only=True) for s in range(1, 10)]
    calibration += [record(1024, 0.5, s, s % 2 == 0, full_only=True) for s in range(10)]
    presses = [record(1024, 0.0, s, True, [("nystrom", 0.5, s < 4)]) for s in range(1, 10)]
    presses.append(record(1024, 0.5, 1, True, [("nystrom", 0.5, True)]))  # not a calibrated cell
    for name, rows in (("passkey.jsonl", calibration), ("passkey-presses.jsonl", presses)):
        (results / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "page.md"
    write_report(str(results), str(out))
    text = out.read_text()
    assert "| 1024 | 10/10 | 5/10 |" in text
    assert "Calibrated cells (full cache >= 90%): 1 of 2: (1024, 0)." in text
    assert "| nystrom | 4/10 |" in text  # seed 0 from the calibration file, 1..9 from the other
    assert "Seeds with press runs, per length: 1024: 10." in text


def test_report_names_each_text_and_window(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    records = [dict(_record(doc, {"nystrom": 0.5, "compresskv": 0.1}), text=text,
                    window=window)
               for doc, (text, window) in enumerate([("persuasion", 0), ("persuasion", 1),
                                                     ("persuasion", 3), ("mobydick", 0)])]
    (results / "press-c100-t8.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_report(str(results), str(tmp_path / "page.md"))
    text = (tmp_path / "page.md").read_text()
    assert "Documents: persuasion windows 0-1, 3; mobydick windows 0 (windows of 108 tokens" in text


def _press_timing(press, compress_s, compress_cpu_s, decode_ms, decode_cpu_ms):
    return {"press": press, "compress_s": compress_s, "compress_cpu_s": compress_cpu_s,
            "compress_peak_mib": 1.0, "decode_s": decode_ms * 10 / 1000,
            "decode_ms_per_token": decode_ms, "decode_cpu_ms_per_token": decode_cpu_ms,
            "decode_peak_mib": 0.0, "cache_bytes_after_compress": 2**20,
            "cache_bytes_after_decode": 2**21}


def _timing(context, presses):
    return {"context": context, "ratio": 0.5, "decode_tokens": 10, "threads": 1,
            "prefill_s": 3.0, "prefill_cpu_s": 1.5, "prefill_peak_mib": 10.0,
            "full_cache_bytes": 2**22, "presses": presses}


def test_timing_table_shows_wall_and_cpu_time(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    press = _press_timing("compresskv", 0.5, 0.25, decode_ms=200.0, decode_cpu_ms=100.0)
    (results / "timing.json").write_text(json.dumps(_timing(64, [press])))
    write_report(str(results), str(tmp_path / "page.md"))
    text = (tmp_path / "page.md").read_text()
    assert "prefill 1.50 s; in the table, wall / CPU." in text
    assert "| compresskv | 0.500 / 0.250 | 200.0 / 100.0 | 0.0 | 1.00 | 2.00 |" in text


def test_each_timing_file_has_its_own_section(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    press = _press_timing("none", 0.0, 0.0, decode_ms=100.0, decode_cpu_ms=90.0)
    for name, context in [("timing.json", 64), ("timing-c256.json", 256)]:
        (results / name).write_text(json.dumps(_timing(context, [press])))
    write_report(str(results), str(tmp_path / "page.md"))
    text = (tmp_path / "page.md").read_text()
    assert text.index("### Time and peak memory, C = 64") < text.index(
        "### Time and peak memory, C = 256")


def _results(directory):
    os.makedirs(directory)
    with open(os.path.join(directory, "perplexity.jsonl"), "w") as handle:
        handle.write(json.dumps({"n_ctx": 64, "chunks": 1, "scored_tokens": 32, "nll": 2.0,
                                 "perplexity": 7.389, "text": "x"}) + "\n")


def test_report_never_replaces_a_page_with_nothing(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# the page\n")
    for results, match in ((tmp_path / "absent", "no such directory"),
                           (tmp_path, "no result files")):
        with pytest.raises(ValueError, match=match):
            write_report(str(results), str(page))
    good = str(tmp_path / "good")
    _results(good)
    # A good file, then one that fails while the page is being made: the old page stays.
    with open(os.path.join(good, "timing.json"), "w") as handle:
        json.dump({"context": 16}, handle)
    with pytest.raises(ValueError, match=r"timing.json: not a result file"):
        write_report(good, str(page))
    assert page.read_text() == "# the page\n" and not list(tmp_path.glob("*.partial"))
    os.remove(os.path.join(good, "timing.json"))
    write_report(good, str(page))
    assert "**7.389**" in page.read_text()
