"""The resolution speed study (subquad.experiments.resolution_speed): the ViT FLOP count
against a hand count, the baseline choice, the interleaved timing order, the config's
errors, and a tiny run of three models through the CSV and the page."""

import math

import pytest

torch = pytest.importorskip("torch")
from subquad.experiments import flops, resolution_speed  # noqa: E402
from subquad.models import ViTClassifier  # noqa: E402
from subquad.train.config import ConfigError  # noqa: E402

# A 6 x 8 image of 3 channels in 2 x 2 patches: a 3 x 4 grid, N = 12 patches.
DIM, LAYERS, CLASSES, N = 8, 2, 5, 12
EMBED = 2 * (DIM * 3 * 2 * 2) * N  # the patch convolution: 96 weights per patch
HEAD = 2 * DIM * CLASSES  # once, on the pooled vector
MLP = 2 * DIM * 4 * DIM  # two Linear layers, hidden 4 dim


def vit(attention, heads, pool, options=None):
    return ViTClassifier((6, 8), 2, 3, CLASSES, dim=DIM, heads=heads, layers=LAYERS,
                         attention=attention, pool=pool, attention_options=options)


@pytest.mark.parametrize("attention", ["exact", "torch"])
def test_deit_flops_match_a_hand_count(attention):
    T = N + 1  # the class token
    weights = 4 * DIM * DIM + MLP  # q, k, v, o
    scores_and_mixing = 2 * T * T * 2 * (4 + 4)  # 2 heads of 4 channels: q.k, then p.v
    expected = EMBED + LAYERS * (2 * weights * T + scores_and_mixing) + HEAD
    assert expected == 53136
    assert flops.vit_forward_flops(vit(attention, 2, "cls")) == expected


def test_circulant2d_flops_match_a_hand_count():
    # CA-DeiT block: dwconv 3x3 (9 per channel), q k v, gate, proj, MLP
    weights = 9 * DIM + 3 * DIM * DIM + DIM * DIM + DIM * DIM + MLP
    # 8 one-channel heads: 6 real transforms of 12 points (2.5 n log2 n) and 4 N products
    mixing = round(8 * (6 * 2.5 * N * math.log2(N) + 4 * N))
    expected = EMBED + LAYERS * (2 * weights * N + mixing) + HEAD
    assert flops.vit_forward_flops(vit("circulant2d", DIM, "mean")) == expected
    # the same block with softmax attention over the grid (2 heads of 4 channels)
    control = vit("circulant2d", 2, "mean", {"circulant2d": {"attention": "exact"}})
    assert flops.vit_forward_flops(control) == (
        EMBED + LAYERS * (2 * weights * N + 2 * N * N * 2 * 8) + HEAD)


def row(label, median, baseline, flop_count=100):
    return {"grid": "4x4", "tokens": 16, "label": label, "median_s": median,
            "baseline": baseline, "flops": flop_count}


def test_the_faster_baseline_is_the_reference():
    for torch_s, exact_s in ((2.0, 3.0), (3.0, 2.0)):
        rows = [row("torch", torch_s, True, 800), row("exact", exact_s, True, 800),
                row("ca", 0.5, False, 100)]
        assert resolution_speed.faster_baseline(rows)["median_s"] == 2.0  # ca is no baseline
        (grid,) = resolution_speed.ratios(rows, ["torch", "exact", "ca"])
        assert grid["baseline"]["label"] == ("torch" if torch_s < exact_s else "exact")
        assert grid["speedup"] == {"ca": 4.0} and grid["flop_ratio"] == {"ca": 8.0}
    # a grid some method has not measured is left out of the ratios
    assert resolution_speed.ratios(rows[:2], ["torch", "exact", "ca"]) == []


def test_repeats_time_every_call_in_turn():
    clock, order = [0.0], []

    def call(i):
        order.append(i)
        clock[0] += i + 1  # call i takes i + 1 "seconds"

    times = resolution_speed.interleaved_times([lambda i=i: call(i) for i in range(3)], 4,
                                               clock=lambda: clock[0])
    assert order == [0, 1, 2] * 4
    assert times == [[1.0] * 4, [2.0] * 4, [3.0] * 4]


SPEED = """[speed]
name = "speed"
grids = [2, 3]
dim = 8
heads = 2
layers = 1
patch = 2
channels = 3
batch = 1
repeats = 2
threads = 1
methods = [
  {{ attention = "torch", label = "torch", pool = "cls", baseline = true }},
  {{ attention = "exact", label = "exact", pool = "cls", baseline = true }},
  {{ attention = "circulant2d", label = "CA", heads = 8 }},
]
{extra}"""


@pytest.mark.parametrize("edit, message", [
    (("repeats = 2", "repeats = 0"), r"speed\.repeats: expected an integer >= 1"),
    (("grids = [2, 3]", "grids = [2, 2]"), r"speed\.grids: expected a list of distinct"),
    (("heads = 8", "heads = 3"), r"speed\.methods\[2\]\.heads: expected a divisor of dim"),
    (("label = \"CA\",", "label = \"CA\", pool = \"cls\","), r"speed\.methods\[2\]\.pool"),
    (("label = \"CA\",", "label = \"CA\", speed = 1,"), r"speed\.methods\[2\]: unknown key"),
    (("label = \"CA\",", "label = \"CA\", baseline = true,"), "every method is marked"),
    (("baseline = true }},\n  {{ attention = \"exact\"", "baseline = 1 }},\n  {{ attention = "
      "\"exact\""), r"speed\.methods\[0\]\.baseline: expected true or false"),
    (("\"circulant2d\"", "\"circulant\""), r"speed\.methods\[2\]\.attention: expected 'torch'"),
    (("threads = 1", "threads = 1\ncolour = 2"), r"unknown key\(s\) \['colour'\]"),
])
def test_config_errors_name_the_key(tmp_path, edit, message):
    path = tmp_path / "speed.toml"
    path.write_text(SPEED.replace(*edit).format(extra=""))
    with pytest.raises(ConfigError, match=message):
        resolution_speed.load_speed(str(path))


def test_three_models_measured_merged_and_paged(tmp_path):
    path, docs = tmp_path / "speed.toml", tmp_path / "docs"
    path.write_text(SPEED.format(extra=""))
    spec = resolution_speed.load_speed(str(path))
    assert [m["heads"] for m in spec["methods"]] == [2, 2, 8]
    assert spec["classes"] == 10  # the default
    assert resolution_speed.main([str(path), "--docs", str(docs)]) == 0
    table = (docs / "speed.csv").read_text().splitlines()
    assert len(table) == 7
    three = [line for line in table if line.startswith("3x3")]
    assert resolution_speed.main([str(path), "--docs", str(docs), "--grids", "2"]) == 0
    merged = (docs / "speed.csv").read_text().splitlines()
    assert len(merged) == 7 and [line for line in merged if line.startswith("3x3")] == three
    kept = resolution_speed.kept_rows(spec, [2], str(docs))
    assert [r["label"] for r in kept] == ["torch", "exact", "CA"]
    assert [r["baseline"] for r in kept] == [True, True, False]
    assert all(r["flops"] > 0 and 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
               for r in kept)
    page = (docs / "speed.md").read_text()
    assert "CA speed-up (time) | FLOP ratio" in page and "| 3x3 | 9 |" in page
    assert (docs / "speed.png").stat().st_size > 0
