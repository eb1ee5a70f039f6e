"""scripts/bench_report.py on a small bench.csv written as `subquad bench` writes it: the
summary's speed-ups, errors and bound shares, the Pareto front, and one plot per family."""

import importlib.util
import pathlib

import pytest

pytest.importorskip("matplotlib")

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_report.py"
spec = importlib.util.spec_from_file_location("bench_report", SCRIPT)
bench_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_report)

HEADER = ("method,batch,tokens,heads,head_dim,value_dim,threads,status,median_s,min_s,spread,"
          "gflops,baseline,speedup,extra_bytes,max_abs_error,relative_error,inputs")


def row(method, tokens, seconds, speedup, error=-1, inputs="gaussian", status="measured",
        heads=8, baseline="exact"):
    return (f"{method},1,{tokens},{heads},64,64,1,{status},{seconds},{seconds},0.1,10,"
            f"{baseline},{speedup},1024,{error},{error},{inputs}")


@pytest.fixture
def csv_path(tmp_path):
    lines = ["# commit abc, cpu test, gemm x, fma_peak_gflops 100, inputs gaussian", HEADER]
    for n, exact_s in ((1024, 0.04), (4096, 0.64)):
        status = "measured" if n == 1024 else "extrapolated from N=1024"
        lines += [row("exact", n, exact_s, 1, status=status),
                  row("fft-lower-bound-packed", n, exact_s / 200, 200),
                  row("cat", n, exact_s / 100, 100),
                  row("cat-causal", n, exact_s / 40, 40, baseline="exact-causal")]
    for n, exact_s in ((256, 0.004), (1024, 0.05)):  # the captured workload, H = 9
        lines += [row("exact", n, exact_s, 1, inputs="smollm2", heads=9),
                  row("wildcat", n, exact_s / 2, 2, 0.05, "smollm2", heads=9),
                  row("uniform-nystrom", n, exact_s / 3, 3, 0.20, "smollm2", heads=9),
                  row("uniform-subsample", n, exact_s / 1.5, 1.5, 0.30, "smollm2", heads=9)]
    path = tmp_path / "bench.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_pareto_front_keeps_the_points_nothing_beats():
    points = [(1.0, 0.5), (2.0, 0.1), (1.5, 0.6), (3.0, 0.2), (0.5, 0.9)]
    assert bench_report.pareto_front(points) == [(0.5, 0.9), (1.0, 0.5), (2.0, 0.1)]


def test_summary_names_speed_up_error_and_bound_share(csv_path):
    _, rows = bench_report.read_rows(str(csv_path))
    lines = {line[1]: line for line in bench_report.summary_rows(rows)}
    cat = lines["cat"]
    assert cat[0] == "CAT" and cat[2] == "4096"       # the largest measured N
    assert cat[5] == "100.0x exact (extrap.)"         # exact was extrapolated there
    assert cat[7] == "50%"                            # the packed bound takes half its time
    assert lines["cat-causal"][7] == "-"              # other transforms than its bound
    wildcat = lines["wildcat"]
    assert wildcat[0] == "WildCat" and wildcat[2] == "1024" and "smollm2" in wildcat[3]
    assert wildcat[5] == "2.0x exact" and wildcat[6] == "0.050"
    assert "fft-lower-bound-packed" not in lines and "exact" not in lines
    text = bench_report.summary_text(rows)
    assert text.startswith("Summary") and "bound/time" in text


def test_report_writes_summary_and_one_plot_per_family(csv_path, tmp_path, capsys):
    out = tmp_path / "report"
    assert bench_report.main([str(csv_path), "--out-dir", str(out)]) == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == ["bench_cat.png", "bench_pareto.png", "bench_wildcat.png", "summary.txt"]
    for name in written[:-1]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "uniform-nystrom" in capsys.readouterr().out


def test_methods_keep_their_colour_and_marker_and_differ_within_a_family():
    for _, _, methods, bounds, _ in bench_report.FAMILIES.values():
        shown = ["exact", "exact-causal"] + methods + bounds
        styles = [bench_report.style_of(m, {}) for m in shown]
        assert len(set(styles)) == len(styles)
        assert len({colour for colour, _ in styles}) == len(styles)
