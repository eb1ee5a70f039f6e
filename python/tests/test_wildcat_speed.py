"""The WildCat speed study (subquad.experiments.wildcat_speed): the crossover and the Pareto
front on hand-made tables, the interleaved timing order, WildCat at full rank against exact
attention, the FLOP model, config errors, a tiny end-to-end run, and the same on a
captured (here fake) grouped-query workload with its capture-again rules."""

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from subquad.experiments import flops, wildcat_speed  # noqa: E402
from subquad.train.config import ConfigError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOAT32_EPS = torch.finfo(torch.float32).eps


def row(n, method, seconds, error, rank=0, kind="gaussian"):
    baseline = method in (wildcat_speed.TORCH, wildcat_speed.EXACT)
    return {"tokens": n, "method": method, "rank": rank, "bins": 1, "input": kind,
            "label": wildcat_speed.label(method, rank, 1), "baseline": baseline,
            "median_s": seconds, "rel_error": error}


def test_crossover_on_a_hand_made_table():
    # N:            1     2     4     8
    # torch         1.0   2.0   4.0   8.0
    # exact         0.5   3.0   3.0   9.0   -> faster baseline 0.5, 2.0, 3.0, 8.0
    # wildcat r=1   0.6   1.5   2.5   2.0   error 0.2 0.2 0.2 0.2
    # wildcat r=2   0.1   2.5   1.0   1.0   error 0.5 0.05 0.4 0.08
    torch_s, exact_s = [1.0, 2.0, 4.0, 8.0], [0.5, 3.0, 3.0, 9.0]
    r1 = [(0.6, 0.2), (1.5, 0.2), (2.5, 0.2), (2.0, 0.2)]
    r2 = [(0.1, 0.5), (2.5, 0.05), (1.0, 0.4), (1.0, 0.08)]
    rows = []
    for i, n in enumerate((1, 2, 4, 8)):
        rows += [row(n, "torch_sdpa", torch_s[i], math.nan), row(n, "exact", exact_s[i], 0.0),
                 row(n, "wildcat", *r1[i], rank=1), row(n, "wildcat", *r2[i], rank=2)]
    rows.append(row(16, "wildcat", 0.001, 0.0, rank=1))  # N = 16 lacks the others: left out
    # <= 0.1: r=2 is within it at N = 2 (not faster: 2.5 > 2.0) and N = 8 (1.0 < 8.0)
    found = wildcat_speed.crossover(rows, 0.1, "gaussian")
    assert found["n"] == 8 and found["holds"]
    assert found["wins"][8]["speedup"] == 8.0 and found["wins"][8]["row"]["rank"] == 2
    assert found["wins"][1] is None and found["wins"][2] is None and 16 not in found["wins"]
    # <= 0.3: r=1 beats 2.0 at N = 2 (1.5), at N = 4 (2.5 < 3.0), at N = 8 both, r=2 faster
    found = wildcat_speed.crossover(rows, 0.3, "gaussian")
    assert found["n"] == 2 and found["holds"] and found["wins"][2]["speedup"] == 2.0 / 1.5
    assert found["wins"][8]["row"]["rank"] == 2
    # <= 1: r=2 at N = 1 (0.1 < 0.5), not at N = 2 ... r=1 is; every N has a winner
    found = wildcat_speed.crossover(rows, 1.0, "gaussian")
    assert found["n"] == 1 and found["holds"]
    # a win that does not last: drop r=1's N = 4 win (make it slower than the baseline)
    rows[10]["median_s"] = 5.0
    found = wildcat_speed.crossover(rows, 0.3, "gaussian")
    assert found["n"] == 2 and not found["holds"] and found["wins"][4] is None
    assert wildcat_speed.crossover(rows, 0.01, "gaussian") == {
        "n": None, "holds": False, "wins": {1: None, 2: None, 4: None, 8: None}}
    assert wildcat_speed.crossover(rows, 0.3, "clustered")["n"] is None  # no such rows


def test_crossover_of_one_method_reads_only_its_rows():
    # N:                1     2     4
    # exact             1.0   2.0   4.0
    # wildcat r=1       0.5   1.0   1.0   error 0.2  (bins 1)
    # nystrom r=1       2.0   0.5   0.5   error 0.1  (bins 1)
    # wildcat r=1 b=2   0.1   0.1   0.1   error 0.9  (bins 2)
    rows = []
    for n, e, w, u, b in ((1, 1.0, 0.5, 2.0, 0.1), (2, 2.0, 1.0, 0.5, 0.1),
                          (4, 4.0, 1.0, 0.5, 0.1)):
        rows += [row(n, "exact", e, 0.0), row(n, "torch_sdpa", 2 * e, 0.0),
                 row(n, "wildcat", w, 0.2, rank=1), row(n, "uniform_nystrom", u, 0.1, rank=1)]
        binned = row(n, "wildcat", b, 0.9, rank=1)
        binned.update(bins=2, label=wildcat_speed.label("wildcat", 1, 2))
        rows.append(binned)
    assert wildcat_speed.crossover(rows, 0.3, "gaussian")["n"] == 1  # wildcat at N = 1
    nystrom = wildcat_speed.crossover(rows, 0.3, "gaussian", ("uniform_nystrom", 1))
    assert nystrom["n"] == 2 and nystrom["holds"] and nystrom["wins"][2]["speedup"] == 4.0
    assert wildcat_speed.crossover(rows, 0.3, "gaussian", ("wildcat", 2))["n"] is None
    assert wildcat_speed.crossover(rows, 1.0, "gaussian", ("wildcat", 2))["wins"][4][
        "speedup"] == 40.0
    table = wildcat_speed.crossover_table(
        {"error_levels": [0.3], "inputs": ["gaussian"], "methods": ["wildcat", "uniform_nystrom"],
         "bins": [1, 2]}, rows)
    assert "| 0.3 | Gaussian | any | 1 | wildcat r=1 bins=1 (0.2, 2x over subquad exact) | yes |" \
        in table
    assert "| 0.3 | Gaussian | uniform_nystrom, 1 bin(s) | 2 | uniform_nystrom r=1 bins=1 (0.1, " \
        "4x over subquad exact) | yes |" in table
    assert "| 0.3 | Gaussian | wildcat, 2 bin(s) | none measured | - | - |" in table
    assert len(table) == 2 + 5  # any, then 2 methods x 2 bin counts


def test_pareto_front_keeps_the_undominated_points():
    points = [(0.5, 1.0), (0.2, 2.0), (0.3, 3.0), (0.1, 4.0), (0.6, 0.5), (0.1, 5.0)]
    assert wildcat_speed.pareto_front(points) == [(0.6, 0.5), (0.5, 1.0), (0.2, 2.0),
                                                  (0.1, 4.0)]


def test_warm_up_then_interleaved_repeats_on_a_fake_clock():
    clock, order, warmed = [0.0], [], []

    def call(i):
        order.append(i)
        clock[0] += i + 1  # call i takes i + 1 "seconds"
        return f"out{i}"

    times = wildcat_speed.timed([lambda i=i: call(i) for i in range(3)], 4,
                                lambda i, out: warmed.append((i, out)), clock=lambda: clock[0])
    assert warmed == [(0, "out0"), (1, "out1"), (2, "out2")]
    assert order == [0, 1, 2] + [0, 1, 2] * 4  # the warm-ups, then A B C per repeat
    assert times == [[1.0] * 4, [2.0] * 4, [3.0] * 4]


def test_flop_models():
    assert flops.exact_attention_flops(3, 5, 2, 4, 6) == 2 * 3 * 5 * 2 * 10
    # one bin: wildcat_attention_cost's terms, M r^2 + 2 M r D + 2 M r (Dv + 1) per kv
    # head, 2 N r (D + Dv + 1) per query head
    M, N, D, r = 100, 7, 4, 10
    compress = M * r * r + 2 * M * r * D + 2 * M * r * (D + 1)
    attend = 2 * N * r * (2 * D + 1)
    assert flops.wildcat_flops(N, M, 4, 2, D, D, r, 1) == 2 * compress + 4 * attend
    assert flops.wildcat_flops(N, M, 4, 2, D, D, r, 1, "uniform_subsample") == 4 * attend
    # bins of 34, 33, 33 keys with 4, 3, 3 points (the kernel's split: the first get more)
    per_bin = sum(n * p * p + 2 * n * p * D + 2 * n * p * (D + 1)
                  for n, p in ((34, 4), (33, 3), (33, 3)))
    assert flops.wildcat_flops(N, M, 1, 1, D, D, r, 3) == per_bin + attend
    # a rank covering the keys keeps them all: attention over M keys, nothing compressed
    assert flops.wildcat_flops(N, M, 1, 1, D, D, M, 1) == 2 * N * M * (2 * D + 1)


SPEED = """[speed]
name = "tiny_speed"
lengths = [48, 96]
heads = 2
head_dim = 8
repeats = 2
threads = 1
ranks = [8, 96]
bins = [1, 2]
methods = ["wildcat", "uniform_nystrom", "uniform_subsample"]
seeds = [0, 1]
clusters = 4
cluster_noise = 0.1
float64_max = 48
error_levels = [0.1, 0.5]
"""


@pytest.mark.parametrize("edit, message", [
    (("repeats = 2", "repeats = 0"), r"speed\.repeats: expected an integer >= 1"),
    (("lengths = [48, 96]", "lengths = [48, 48]"), r"speed\.lengths: expected a list of "
                                                   "distinct"),
    (("ranks = [8, 96]", "ranks = [1, 96]"), r"speed\.bins: every bin count must be <="),
    (("seeds = [0, 1]", "seeds = [-1]"), r"speed\.seeds: expected a list of distinct "
                                         "integers >= 0"),
    (("\"uniform_subsample\"]", "\"subsample\"]"), r"speed\.methods: expected distinct names"),
    (("cluster_noise = 0.1", "cluster_noise = 0"), r"speed\.cluster_noise: expected a finite"),
    (("float64_max = 48", "float64_max = -1"), r"speed\.float64_max: expected an integer >= 0"),
    (("error_levels = [0.1, 0.5]", "error_levels = [0]"), r"speed\.error_levels: expected a "
                                                          "list of numbers > 0"),
    (("threads = 1", "threads = 1\ncolour = 2"), r"unknown key\(s\) \['colour'\]"),
    (("heads = 2\n", ""), r"missing key\(s\) \['heads'\]"),
])
def test_config_errors_name_the_key(tmp_path, edit, message):
    path = tmp_path / "speed.toml"
    text = SPEED.replace(*edit)
    assert text != SPEED
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        wildcat_speed.load_speed(str(path))


def test_the_shipped_config_loads():
    spec = wildcat_speed.load_speed(os.path.join(ROOT, "configs", "experiments",
                                                 "wildcat_speed.toml"))
    assert max(spec["lengths"]) == 65536 and spec["threads"] == 1 and spec["repeats"] >= 5
    assert len(wildcat_speed.approximations(spec)) == 3 * len(spec["ranks"]) * len(spec["bins"])
    real = wildcat_speed.load_speed(os.path.join(ROOT, "configs", "experiments",
                                                 "wildcat_speed_smollm2.toml"))
    assert real["inputs"][0] == "smollm2:3" and 3136 in real["lengths"]
    assert max(real["lengths"]) <= 8192 == real["float64_max"]  # the model's context


def test_clustered_keys_gather_around_their_centres():
    spec = {"data_seed": 0, "heads": 2, "head_dim": 8, "clusters": 3, "cluster_noise": 0.01}
    q, k, v = wildcat_speed.inputs(spec, 50, "clustered")
    assert q.shape == k.shape == v.shape == (1, 50, 2, 8)
    for h in range(2):  # keys of a centre lie ~0.04 apart, centres ~4: at most 3 groups
        near = torch.cdist(k[0, :, h], k[0, :, h]) < 0.2
        assert (near | (torch.cdist(k[0, :, h], k[0, :, h]) > 1.0)).all()
        assert 1 < len(torch.unique(near, dim=0)) <= 3
    g = wildcat_speed.inputs(spec, 50, "gaussian")
    assert torch.equal(g[0], q) and not torch.equal(g[1], k)  # the same q, other keys
    assert torch.equal(wildcat_speed.inputs(spec, 50, "clustered")[1], k)  # fixed per N


def test_tiny_run_writes_csv_page_and_plot_and_full_rank_is_exact(tmp_path, capsys):
    path, docs = tmp_path / "speed.toml", tmp_path / "docs"
    path.write_text(SPEED)
    assert wildcat_speed.main([str(path), "--docs", str(docs)]) == 0
    spec = wildcat_speed.load_speed(str(path))
    rows = wildcat_speed.kept_rows(spec, [], str(docs))  # every row of the CSV
    # 2 lengths x (2 baselines + 3 methods x 2 ranks x 2 bins) x 2 input kinds
    assert len(rows) == 2 * 14 * 2
    assert all(0 < r["min_s"] <= r["median_s"] <= r["max_s"] for r in rows)
    assert all(r["flops"] > 0 for r in rows)
    by = {(r["tokens"], r["label"], r["input"]): r for r in rows}
    for kind in wildcat_speed.SYNTHETIC:
        # N = 48 has a float64 reference: both exact baselines' own errors are round-off
        exact = by[48, "subquad exact", kind]
        assert exact["reference"] == "float64"
        assert 0 < exact["rel_error"] < 1e-5 and by[48, "torch SDPA", kind]["rel_error"] < 1e-5
        # N = 96 compares against the float32 exact kernel (its own error not measured)
        assert by[96, "subquad exact", kind]["reference"] == "exact float32"
        assert math.isnan(by[96, "subquad exact", kind]["rel_error"])
        assert by[96, "torch SDPA", kind]["rel_error"] < 1e-5
        for method in spec["methods"]:
            for bins in (1, 2):
                # r = 96 >= N keeps every key: exact attention up to float32 round-off,
                # within twice the exact kernel's error plus 16 ulps (src/wildcat's bound)
                for n in (48, 96):
                    full = by[n, f"{method} r=96 bins={bins}", kind]
                    bound = 2 * by[48, "subquad exact", kind]["rel_error"] + 16 * FLOAT32_EPS
                    assert full["rel_error_max"] <= bound, (n, method, bins, kind)
                # r = 8 < N really approximates
                assert by[96, f"{method} r=8 bins={bins}", kind]["rel_error"] > 1e-3
    assert by[96, "wildcat r=8 bins=1", "gaussian"]["seeds"] == "0 1"
    assert by[96, "wildcat r=8 bins=1", "clustered"]["rel_error_min"] <= \
        by[96, "wildcat r=8 bins=1", "clustered"]["rel_error"] <= \
        by[96, "wildcat r=8 bins=1", "clustered"]["rel_error_max"]
    page = (docs / "tiny_speed.md").read_text()
    assert "## Crossover" in page and "| 0.1 | clustered keys |" in page
    assert "| wildcat r=8 bins=2 |" in page and "**" in page  # the faster baseline marked
    assert (docs / "tiny_speed.png").stat().st_size > 0
    # a rerun of one length keeps the other's rows; other settings refuse before measuring
    csv_96 = [line for line in (docs / "tiny_speed.csv").read_text().splitlines()
              if line.startswith("96,")]
    assert wildcat_speed.main([str(path), "--docs", str(docs), "--lengths", "48"]) == 0
    assert [line for line in (docs / "tiny_speed.csv").read_text().splitlines()
            if line.startswith("96,")] == csv_96
    # rows from another machine are refused too: their times would sit beside these
    text = (docs / "tiny_speed.csv").read_text()
    machine = rows[0]["machine"]
    assert machine and all(r["machine"] == machine for r in rows)
    (docs / "tiny_speed.csv").write_text(text.replace(machine, "Another CPU"))
    assert wildcat_speed.main([str(path), "--docs", str(docs), "--lengths", "48"]) == 2
    assert "measured on another machine" in capsys.readouterr().err
    (docs / "tiny_speed.csv").write_text(text)
    path.write_text(SPEED.replace("seeds = [0, 1]", "seeds = [0]"))
    assert wildcat_speed.main([str(path), "--docs", str(docs), "--lengths", "48"]) == 2


@pytest.mark.parametrize("inputs", ['["smollm2:30"]', '["uniform"]', '["gaussian", "gaussian"]',
                                    '[]', '"gaussian"', '["smollm2:"]'])
def test_input_kinds_are_checked(tmp_path, inputs):
    path = tmp_path / "speed.toml"
    path.write_text(SPEED + f"inputs = {inputs}\n")
    with pytest.raises(ConfigError, match=r"speed\.inputs: expected distinct input kinds"):
        wildcat_speed.load_speed(str(path))


def fake_capture(tokens, blocks=(3,), heads=9, kv_heads=3, dim=8, seed=0):
    """A capture's layout (block -> q [1, N, H, D], k and v [1, N, Hkv, D]), random
    entries."""
    generator = np.random.default_rng(seed)
    return {b: {"q": generator.standard_normal((1, tokens, heads, dim), dtype=np.float32),
                "k": generator.standard_normal((1, tokens, kv_heads, dim), dtype=np.float32),
                "v": generator.standard_normal((1, tokens, kv_heads, dim), dtype=np.float32)}
            for b in blocks}


def test_real_inputs_run_grouped_query_attention_and_full_rank_is_exact(tmp_path):
    """A "smollm2:B" kind reads the workload folder (here a fake capture of 9 query heads
    over 3 KV heads, saved as subquad-llm capture saves one) and times it; every method
    runs grouped-query attention, and a rank covering the keys is exact."""
    from subquad.llm.attention_workload import save_workload

    workload = tmp_path / "workload"
    save_workload(fake_capture(100), str(workload), {"text": "persuasion", "offset": 0})
    path, docs = tmp_path / "speed.toml", tmp_path / "docs"
    path.write_text(SPEED + f'inputs = ["smollm2:3", "gaussian"]\nworkload = "{workload}"\n')
    assert wildcat_speed.main([str(path), "--docs", str(docs)]) == 0
    spec = wildcat_speed.load_speed(str(path))
    rows = wildcat_speed.kept_rows(spec, [], str(docs))
    assert len(rows) == 2 * 14 * 2 and {r["timed_input"] for r in rows} == {"smollm2:3"}
    by = {(r["tokens"], r["label"], r["input"]): r for r in rows}
    exact48 = by[48, "subquad exact", "smollm2:3"]
    assert exact48["heads"] == 9 and exact48["head_dim"] == 8
    assert exact48["flops"] == flops.exact_attention_flops(48, 48, 9, 8, 8)
    assert by[48, "wildcat r=8 bins=1", "smollm2:3"]["flops"] == flops.wildcat_flops(
        48, 48, 9, 3, 8, 8, 8, 1, "wildcat")
    assert 0 < exact48["rel_error"] < 1e-5
    assert by[48, "torch SDPA", "smollm2:3"]["rel_error"] < 1e-5
    bound = 2 * exact48["rel_error"] + 16 * FLOAT32_EPS
    for n in (48, 96):
        for method in spec["methods"]:
            assert by[n, f"{method} r=96 bins=1", "smollm2:3"]["rel_error_max"] <= bound
        assert by[n, "wildcat r=8 bins=1", "smollm2:3"]["rel_error"] > 1e-3
    page = (docs / "tiny_speed.md").read_text()
    assert "## Relative error, SmolLM2 block 3 / Gaussian" in page
    assert "| 0.1 | SmolLM2 block 3 |" in page and "9 heads and k, v of 3 KV heads" in page
    # the input kinds are part of the settings: a rerun with the default kinds refuses
    path.write_text(SPEED)
    assert wildcat_speed.main([str(path), "--docs", str(docs), "--lengths", "48"]) == 2


def test_a_workload_too_short_or_corrupt_is_captured_again(tmp_path, monkeypatch):
    import subquad.llm

    class Captured(Exception):
        pass

    def load(*args, **kwargs):
        raise Captured

    monkeypatch.setattr(subquad.llm, "load", load)
    workload = tmp_path / "workload"
    spec = {"inputs": ["smollm2:3", "gaussian"], "workload": str(workload)}
    with pytest.raises(Captured):  # no folder yet
        wildcat_speed.captured_inputs(spec, 64)
    from subquad.llm.attention_workload import save_workload

    save_workload(fake_capture(64), str(workload), {"text": "persuasion", "offset": 0})
    got = wildcat_speed.captured_inputs(spec, 64)  # read back, not captured
    assert got[3]["q"].shape == (1, 64, 9, 8)
    q, k, v = wildcat_speed.inputs(spec, 48, "smollm2:3", got)
    assert q.shape == (1, 48, 9, 8) and k.shape == v.shape == (1, 48, 3, 8)
    assert torch.equal(q, torch.from_numpy(got[3]["q"][:, :48]))
    with pytest.raises(Captured):  # more tokens than the folder holds
        wildcat_speed.captured_inputs(spec, 65)
    with pytest.raises(Captured):  # a block it does not hold
        wildcat_speed.captured_inputs({**spec, "inputs": ["smollm2:4"]}, 64)
    with open(workload / "k.npy", "r+b") as handle:  # a changed file fails its manifest
        handle.seek(200)
        handle.write(b"\x00\x01\x02")
    with pytest.raises(Captured):
        wildcat_speed.captured_inputs(spec, 64)
    assert wildcat_speed.captured_inputs({"inputs": ["gaussian"], "workload": ""}, 64) == {}
