"""The evidence protocol's machinery (subquad.experiments.protocol and the [protocol]
experiment files): log-spaced evaluation steps, the convergence test, t-intervals,
McNemar's exact test and the four verdict words against hand computations, the
learning-rate sweep's choice and its extension at the grid's edge, bad protocol tables
named, and a source experiment without claims."""

import json
import math
import os

import pytest

pytest.importorskip("torch")
from subquad.experiments import protocol  # noqa: E402
from subquad.experiments.spec import Claim, load_experiment  # noqa: E402
from subquad.train.config import ConfigError  # noqa: E402
from subquad.train.loop import evaluation_steps, plateau_reference  # noqa: E402

T_975_DF2 = 4.302652729911275  # Student's t, 97.5% quantile, 2 degrees of freedom


def test_log_spaced_evaluations_include_the_plateau_reference_and_the_end():
    steps = evaluation_steps({"steps": 3000, "eval_points": 12, "eval_every": 50})
    assert steps[0] == 30 and steps[-1] == 3000
    assert plateau_reference(3000) == 2250 and 2250 in steps
    assert len(steps) >= 12 and steps == sorted(set(steps))
    gaps = [b / a for a, b in zip(steps, steps[1:]) if b != 2250 and a != 2250]
    assert max(gaps) / min(gaps) < 1.2  # evenly spaced on a log scale
    assert evaluation_steps({"steps": 120, "eval_points": 0, "eval_every": 50}) == [50, 100, 120]


def curve(losses, steps):
    return [{"step": s, "loss": v, "perplexity": math.exp(v)} for s, v in zip(steps, losses)]


STEPS = [10, 20, 40, 80, 160, 320, 500, 640, 750, 1000]


def test_a_run_that_plateaus_below_the_anchor_converges():
    losses = [3.0, 2.5, 2.0, 1.8, 1.6, 1.5, 1.45, 1.43, 1.42, 1.415]
    result = protocol.convergence(curve(losses, STEPS), 1000, "perplexity", anchor=5.0,
                                  lower_is_better=True, tolerance=0.01)
    assert result["converged"] and result["reason"] == ""
    assert result["last_quarter_improvement"] == pytest.approx((1.42 - 1.415) / 1.42)


@pytest.mark.parametrize("losses, steps, anchor, reason", [
    ([3.0, 2.5, 2.0, 1.8, 1.6, 1.5, 1.45, 1.43, 1.42, 1.415], STEPS, 4.0, "anchor"),
    ([3.0, 2.5, 2.0, 1.8, 1.6, 1.5, 1.45, 1.43, 1.42, 1.30], STEPS, 5.0, "still improving"),
    ([3.0, 1.6, 1.42, 1.415], [10, 100, 750, 1000], 5.0, "evaluations"),
])
def test_each_failed_condition_is_named(losses, steps, anchor, reason):
    result = protocol.convergence(curve(losses, steps), 1000, "perplexity", anchor=anchor,
                                  lower_is_better=True, tolerance=0.01)
    assert not result["converged"] and reason in result["reason"]


# A 3,000-step run that early stopping (patience 3) ended at step 1000, three evaluations
# after its best (step 640's), which are the weights it reports.
STOPPED_LOSSES = [3.0, 2.5, 2.0, 1.8, 1.6, 1.5, 1.45, 1.30, 1.35, 1.36, 1.37]
STOPPED_STEPS = [10, 20, 40, 80, 160, 320, 500, 640, 750, 900, 1000]
EARLY_STOP = {"stopped_early": True, "best_step": 640, "stopped_at": 1000}


def test_an_early_stop_counts_as_plateaued_and_is_judged_on_its_best_evaluation():
    rows = curve(STOPPED_LOSSES, STOPPED_STEPS)
    # exp(1.30) = 3.67 beats the anchor 3.8, the last evaluation's exp(1.37) = 3.94 not.
    result = protocol.convergence(rows, 3000, "perplexity", 3.8, True, 0.01, EARLY_STOP)
    assert result["converged"] and result["plateaued"] and result["early_stopped"]
    assert result["reason"] == ("plateaued: early stopping ended it (early stop at step "
                                "1000 (best 640))")
    # Without the early stop the same curve has not plateaued (it ended before the last
    # quarter of its 3,000 steps began) and its last evaluation misses the anchor.
    plain = protocol.convergence(rows, 3000, "perplexity", 3.8, True, 0.01)
    assert not plain["converged"] and not plain["plateaued"]
    assert "does not beat the anchor" in plain["reason"]


@pytest.mark.parametrize("keep, anchor, reason", [
    (9, 5.0, "9 evaluations (< 10)"),
    (11, 3.5, "perplexity 3.669 does not beat the anchor's 3.5"),
])
def test_an_early_stop_still_needs_the_anchor_and_ten_evaluations(keep, anchor, reason):
    rows = curve(STOPPED_LOSSES, STOPPED_STEPS)[-keep:]
    result = protocol.convergence(rows, 3000, "perplexity", anchor, True, 0.01, EARLY_STOP)
    assert result["plateaued"] and not result["converged"]
    assert reason in result["reason"] and "early stopping ended it" in result["reason"]


def test_higher_is_better_metrics_must_exceed_the_anchor():
    rows = [dict(r, accuracy=0.8) for r in curve([1.0] * 10, STEPS)]
    assert protocol.convergence(rows, 1000, "accuracy", 0.75, False, 0.01)["converged"]
    assert not protocol.convergence(rows, 1000, "accuracy", 0.85, False, 0.01)["converged"]


def test_t_interval_matches_a_hand_computation():
    values = [0.01, 0.03, 0.02]
    mean, low, high = protocol.t_interval(values)
    half = T_975_DF2 * 0.01 / math.sqrt(3)  # sample sd of the three values is 0.01
    assert mean == pytest.approx(0.02)
    assert (low, high) == pytest.approx((0.02 - half, 0.02 + half))
    with pytest.raises(ValueError, match="2 values"):
        protocol.t_interval([1.0])


BETTER = Claim("v beats b", "v", "b", "better", 0.0)
MATCHES = Claim("v matches b", "v", "b", "matches", 0.02)


@pytest.mark.parametrize("claim, differences, lower, verdict", [
    (BETTER, [-0.10, -0.12, -0.11], True, protocol.REPRODUCED),
    (BETTER, [0.10, 0.12, 0.11], True, protocol.CONTRADICTED),
    (BETTER, [-0.10, 0.12, 0.01], True, protocol.NO_DIFFERENCE),
    (BETTER, [0.10, 0.12, 0.11], False, protocol.REPRODUCED),  # accuracy: higher is better
    (MATCHES, [0.001, -0.002, 0.0], True, protocol.REPRODUCED),
    (MATCHES, [0.10, 0.11, 0.12], True, protocol.CONTRADICTED),
    (MATCHES, [0.03, -0.03, 0.0], True, protocol.NO_DIFFERENCE),
])
def test_verdicts_follow_the_rule(claim, differences, lower, verdict):
    decided = protocol.decide(claim, dict(enumerate(differences, 1)), lower, [])
    assert decided["verdict"] == verdict
    assert decided["low"] <= decided["mean"] <= decided["high"]


def test_runs_that_did_not_converge_leave_the_claim_not_tested():
    decided = protocol.decide(BETTER, {1: -0.1, 2: -0.1, 3: -0.1}, True, ["v seed 2"])
    assert decided["verdict"] == protocol.NOT_TESTED and "v seed 2" in decided["reason"]
    assert protocol.decide(BETTER, {1: -0.1}, True, [])["verdict"] == protocol.NOT_TESTED


@pytest.mark.parametrize("only_a, only_b, p", [
    (1, 7, 2 * (1 + 8) / 2 ** 8),  # 2 P(X <= 1), X ~ Bin(8, 1/2) = 18 / 256
    (5, 0, 2 / 2 ** 5),            # 2 P(X <= 0), X ~ Bin(5, 1/2)
    (2, 2, 1.0),                   # 2 P(X <= 2) = 2 x 11 / 16 > 1: capped
    (0, 0, 1.0),                   # no discordant pair: no evidence either way
])
def test_mcnemar_matches_a_hand_computation(only_a, only_b, p):
    # 3 pairs both right and 2 both wrong around the discordant ones: they do not count.
    a = [True] * 3 + [False] * 2 + [True] * only_a + [False] * only_b
    b = [True] * 3 + [False] * 2 + [False] * only_a + [True] * only_b
    test = protocol.mcnemar(a, b)
    assert (test["only_a"], test["only_b"], test["discordant"]) == (only_a, only_b,
                                                                    only_a + only_b)
    assert test["p"] == pytest.approx(p, rel=1e-12)
    assert protocol.mcnemar(b, a)["p"] == test["p"]  # two-sided
    with pytest.raises(ValueError, match="same examples"):
        protocol.mcnemar(a, b[1:])


def test_paired_relative_differences_pair_by_seed():
    assert protocol.paired_relative({1: 9.0, 2: 11.0, 3: 5.0}, {1: 10.0, 2: 10.0}) == \
        pytest.approx({1: -0.1, 2: 0.1})


EXPERIMENT = """
[experiment]
name = "tiny_protocol"
seeds = [1, 2]
metrics = ["perplexity", "loss"]

[protocol]
{protocol}

[run]
family = "lm"
progress = false

[data]
length = 16

[model]
dim = 16
heads = 2
layers = 1

[train]
steps = 30
batch_size = 2
lr = 1e-3
warmup = 2
eval_points = 10
eval_batches = 1
checkpoint_every = 10

[[variant]]
name = "attention"

[[variant]]
name = "cat"
model = {{ attention = "cat-causal" }}

{claims}
"""
CLAIM = """[[claim]]
text = "causal CAT beats attention"
variant = "cat"
baseline = "attention"
rule = "better"
"""


def write(tmp_path, protocol_lines="", claims=CLAIM):
    if "anchor" not in protocol_lines:
        protocol_lines += '\nanchor = "4-gram"'
    path = tmp_path / "experiment.toml"
    path.write_text(EXPERIMENT.format(protocol=protocol_lines, claims=claims))
    return str(path)


@pytest.mark.parametrize("protocol_lines, claims, message", [
    ("tuning_seed = 1", CLAIM, "must not be the tuning seed"),
    ("lr_factors = [1, 2]", CLAIM, "lr_factors"),
    ("sweep_fraction = 0", CLAIM, "sweep_fraction"),
    ("colour = 1", CLAIM, "unknown key"),
    ("", "", "at least one [[claim]]"),
    ('source_of = "study.toml"', "", "trains one variant"),
    ("source_of = 3", CLAIM, "protocol.source_of: expected the path"),
    ("", CLAIM.replace('"cat"', '"cta"'), "'cta' is not a variant"),
    ("", CLAIM.replace('"attention"', '"cat"'), "another variant than the claim's own"),
    ("", CLAIM.replace('"better"', '"matches"'), "margin"),
    ("", CLAIM.replace('"better"', '"worse"'), "rule"),
    ('anchor = "4gram"', CLAIM, "not an anchor of family 'lm'"),
])
def test_bad_protocol_tables_name_the_problem(tmp_path, protocol_lines, claims, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_experiment(write(tmp_path, protocol_lines, claims), str(tmp_path / "runs"))


def test_a_source_experiment_has_one_variant_and_names_its_study(tmp_path):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "experiments",
                        "vit_p2_protocol.toml")
    experiment = load_experiment(path, str(tmp_path))
    assert experiment.protocol.claims == () and len(experiment.variants) == 1
    assert experiment.protocol.source_of == "configs/experiments/wildcat_vit_protocol.toml"
    unnamed = tmp_path / "unnamed.toml"
    unnamed.write_text("".join(line for line in open(path) if not line.startswith("source_of")))
    with pytest.raises(ConfigError, match=r"at least one \[\[claim\]\]"):
        load_experiment(str(unnamed), str(tmp_path))


def fake_sweep(experiment, variant, scores):
    for factor, value in scores.items():
        directory = experiment.sweep_dir(variant, factor)
        os.makedirs(directory, exist_ok=True)
        row = {"diverged": True} if value is None else {"val_perplexity": value}
        with open(os.path.join(directory, protocol.RESULT), "w") as file:
            json.dump(row, file)


def test_the_sweep_chooses_the_best_rate_and_grows_at_an_edge(tmp_path):
    experiment = load_experiment(write(tmp_path), str(tmp_path / "runs"))
    config = experiment.config(experiment.variants[0], 0, sweep=True, lr_factor=2.0)
    assert config["train"]["steps"] == 10 and config["train"]["lr"] == pytest.approx(2e-3)
    assert config["run"]["out"].endswith(os.path.join("sweep", "attention", "lr2"))
    assert protocol.sweep_state(experiment, "attention").pending == [0.5, 1.0, 2.0]
    fake_sweep(experiment, "attention", {0.5: 9.0, 1.0: 8.0, 2.0: None})  # 2x diverged
    state = protocol.sweep_state(experiment, "attention")
    assert state.chosen == 1.0 and state.pending == [] and math.isinf(state.scores[2.0])
    fake_sweep(experiment, "cat", {0.5: 9.0, 1.0: 8.0, 2.0: 7.0})
    assert protocol.sweep_state(experiment, "cat").pending == [4.0]
    fake_sweep(experiment, "cat", {4.0: 7.5})
    assert protocol.sweep_state(experiment, "cat").chosen == 2.0


def test_a_label_with_bars_stays_one_table_cell():
    """MLR's label names its ranks 16|4|3: in a Markdown row the bars are escaped, so the
    row keeps its number of cells."""
    from subquad.experiments.report import table_cell

    row = f"| {table_cell('MLR attention 16|4|3')} | x1: 6.7 | 0.016 (x8) |"
    assert row.replace("\\|", "").count("|") == 4
    assert table_cell("attention") == "attention"
