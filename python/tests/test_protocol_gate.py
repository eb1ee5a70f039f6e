"""The protocol's gate ([protocol.gate]): control variants that must reach a bound in every
reported seed before any claim is read. Good and bad tables, each error named; the gate met
(claims decided as without it, a compared variant's failure still counting) and not met
(a value past the bound, a control that did not converge, a missing seed or metric: every
claim not tested, naming why); the quantity read relative to another metric; the page."""

import json
import os

import pytest

pytest.importorskip("torch")
from subquad.experiments import protocol, protocol_report  # noqa: E402
from subquad.experiments.spec import Gate, load_experiment  # noqa: E402
from subquad.train.config import ConfigError  # noqa: E402
from subquad.train.metrics import JSONL  # noqa: E402

from test_protocol import write  # noqa: E402

# The control ("attention") must reach 0.4 of the zero predictor's test MSE; the claim
# ("causal CAT beats attention") is read on test perplexity.
GATE = """variants = ["attention"]
metric = "mse"
relative_to = "zero_mse"
at_most = 0.4
"""
CONVERGED = {"converged": True, "reason": ""}


def gate_file(tmp_path, gate=GATE):
    return write(tmp_path, 'anchor = "4-gram"\n\n[protocol.gate]\n' + gate)


def load(tmp_path, gate=GATE):
    return load_experiment(gate_file(tmp_path, gate), str(tmp_path / "runs"))


def test_a_gate_table_is_read(tmp_path):
    assert load(tmp_path).protocol.gate == Gate(("attention",), "mse", "zero_mse", 0.4, True,
                                                "test")
    other = load(tmp_path, 'variants = ["cat", "attention"]\nmetric = "accuracy"\n'
                           'at_least = 1\nsplit = "validation"\n').protocol.gate
    assert other == Gate(("cat", "attention"), "accuracy", None, 1.0, False, "validation")
    assert other.rule() == "validation accuracy >= 1"
    assert load_experiment(write(tmp_path), str(tmp_path / "runs")).protocol.gate is None


@pytest.mark.parametrize("gate, message", [
    ("colour = 1\n" + GATE, "protocol.gate: unknown key(s) ['colour']; accepted: ['at_least', "
                            "'at_most', 'metric', 'relative_to', 'split', 'variants']"),
    (GATE.replace('variants = ["attention"]\n', ""), "protocol.gate.variants: required"),
    (GATE.replace('["attention"]', "[]"), "protocol.gate.variants: expected a non-empty "
                                          "list of distinct variant names, got []"),
    (GATE.replace('["attention"]', '["cat", "cat"]'), "distinct variant names, got ['cat', "
                                                      "'cat']"),
    (GATE.replace('["attention"]', '"attention"'), "protocol.gate.variants: expected "
                                                   "<class 'list'>"),
    (GATE.replace('["attention"]', '["atention"]'), "protocol.gate.variants: 'atention' is "
                                                    "not a variant (has ['attention', 'cat'])"),
    (GATE.replace('metric = "mse"\n', ""), "protocol.gate.metric: required"),
    (GATE.replace('"mse"', "2"), "protocol.gate.metric: expected <class 'str'>, got 2"),
    (GATE.replace('"zero_mse"', '"mse"'), "protocol.gate.relative_to: expected the name of "
                                          "another recorded metric (the gate reads mse / "
                                          "relative_to), got 'mse'"),
    (GATE + "at_least = 0.1\n", "protocol.gate: expected exactly one of at_most, at_least "
                                "(a number), got ['at_most', 'at_least']"),
    (GATE.replace("at_most = 0.4\n", ""), "protocol.gate: expected exactly one of at_most, "
                                          "at_least (a number), got neither"),
    (GATE.replace("0.4", '"0.4"'), "protocol.gate.at_most: expected a finite number, got "
                                   "'0.4'"),
    (GATE.replace("at_most = 0.4", "at_least = inf"), "protocol.gate.at_least: expected a "
                                                      "finite number, got inf"),
    (GATE + 'split = "val"\n', "protocol.gate.split: expected one of ['test', 'validation'], "
                               "got 'val'"),
])
def test_bad_gate_tables_name_the_key_and_the_form(tmp_path, gate, message):
    with pytest.raises(ConfigError) as error:
        load(tmp_path, gate)
    assert message in str(error.value)


def test_a_gate_must_be_a_table_and_gate_claims(tmp_path):
    with pytest.raises(ConfigError, match=r"protocol.gate: expected a table \(\[protocol.gate\]"):
        load_experiment(write(tmp_path, "gate = 0.4"), str(tmp_path / "runs"))
    source = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "experiments",
                          "vit_p2_protocol.toml")
    gated = tmp_path / "source.toml"
    variant = load_experiment(source, str(tmp_path)).variants[0].name
    gated.write_text(open(source).read() + f'\n[protocol.gate]\nvariants = ["{variant}"]\n'
                                            f'metric = "accuracy"\nat_least = 0.8\n')
    with pytest.raises(ConfigError, match=r"protocol.gate: a gate decides whether claims are "
                                          r"read; this file has no \[\[claim\]\]"):
        load_experiment(str(gated), str(tmp_path))


def row(variant, seed, perplexity, mse=0.2, zero_mse=1.0, convergence=CONVERGED):
    """A finished reported run's result, as run.py writes it (the fields the verdicts and
    the page read)."""
    return {"variant": variant, "label": variant, "seed": seed, "test_perplexity": perplexity,
            "val_perplexity": perplexity, "test_loss": 1.0, "test_mse": mse,
            "test_zero_mse": zero_mse, "convergence": dict(convergence), "lr": 1e-3,
            "steps": 30, "params": 1000, "attention_params": 100, "cpu_s": 1.0,
            "wall_s": 2.0, "tokens": 960, "cpu": "test cpu", "cores": 2, "commit": "abc"}


def rows(cat=(3.0, 3.1), attention=(4.0, 4.2), **changes):
    """Seeds 1 and 2 of both variants (cat better than attention in each); changes:
    attention seed k's fields as attention<k>={...}, or None to leave the run out."""
    out = [row("cat", seed, value) for seed, value in zip((1, 2), cat)]
    for seed, value in zip((1, 2), attention):
        change = changes.get(f"attention{seed}", {})
        if change is not None:
            out.append({**row("attention", seed, value), **change})
    return out


def verdict(experiment, results):
    [decided] = protocol_report.claim_rows(experiment, results)
    return decided["verdict"], decided["reason"]


def test_a_met_gate_leaves_the_claims_decided_as_without_it(tmp_path):
    gated = load(tmp_path)
    plain = load_experiment(write(tmp_path), str(tmp_path / "runs"))  # the same, ungated
    for results, expected in ((rows(), protocol.REPRODUCED),
                              # The compared variant's failure counts: it is not gated.
                              (rows(cat=(5.0, 5.3)), protocol.CONTRADICTED)):
        assert verdict(gated, results) == verdict(plain, results)
        assert verdict(gated, results)[0] == expected
    # 0.4 exactly is "at most 0.4"
    assert verdict(gated, rows(attention1={"test_mse": 0.4}))[0] == protocol.REPRODUCED


@pytest.mark.parametrize("changes, reason", [
    ({"attention2": {"test_mse": 0.5}}, "attention seed 2: test mse / zero_mse 0.5 > 0.4"),
    # relative: 0.3 of a zero predictor at 0.5 is 0.6 of it
    ({"attention1": {"test_mse": 0.3, "test_zero_mse": 0.5}},
     "attention seed 1: test mse / zero_mse 0.6 > 0.4"),
    ({"attention1": {"convergence": {"converged": False, "reason": "loss still improving: "
                                                                   "3.00% over the last quarter"}}},
     "attention seed 1 did not converge (loss still improving: 3.00% over the last quarter)"),
    ({"attention2": None}, "attention seed 2 unfinished"),
    ({"attention1": {"test_zero_mse": None}}, "attention seed 1 no test_zero_mse in its result"),
    ({"attention1": {"test_mse": 0.9}, "attention2": None},
     "attention seed 1: test mse / zero_mse 0.9 > 0.4; attention seed 2 unfinished"),
])
def test_an_unmet_gate_leaves_every_claim_not_tested(tmp_path, changes, reason):
    experiment = load(tmp_path)
    # Without the gate these runs reproduce the claim.
    assert verdict(experiment, rows())[0] == protocol.REPRODUCED
    decided = protocol_report.claim_rows(experiment, rows(**changes))
    assert [(d["verdict"], d["reason"], d["differences"]) for d in decided] == [
        (protocol.NOT_TESTED, "gate not met: " + reason, {})]


def test_a_gate_at_least_on_the_validation_split_without_relative_to(tmp_path):
    gate = Gate(("cat", "attention"), "accuracy", None, 0.8, False, "validation")
    results = {("cat", 1): {"val_accuracy": 0.85, "test_accuracy": 0.1, "convergence": CONVERGED},
               ("attention", 1): {"val_accuracy": 0.75, "convergence": CONVERGED}}
    outcome = protocol.gate_outcome(gate, results, [1])
    assert not outcome["met"]
    assert outcome["reason"] == "attention seed 1: validation accuracy 0.75 < 0.8"
    assert [(c["variant"], c["value"], c["passes"]) for c in outcome["checks"]] == [
        ("cat", 0.85, True), ("attention", 0.75, False)]
    results["attention", 1]["val_accuracy"] = 0.8
    assert protocol.gate_outcome(gate, results, [1]) == {
        "met": True, "reason": "", "checks": [
            {"variant": v, "seed": 1, "value": value, "finished": True, "within": True,
             "converged": True, "passes": True} for v, value in (("cat", 0.85),
                                                                   ("attention", 0.8))]}


def write_results(experiment, results):
    """The rows as result.json files in their run directories, with the configuration
    each run would have been made with and a two-point validation curve (what the page
    reads)."""
    for result in results:
        directory = experiment.run_dir(result["variant"], result["seed"])
        os.makedirs(directory, exist_ok=True)
        config = experiment.config(experiment.variant(result["variant"]), result["seed"])
        with open(os.path.join(directory, protocol.RESULT), "w") as file:
            json.dump({**result, "config": config}, file)
        with open(os.path.join(directory, JSONL), "w") as file:
            for step in (10, 30):
                file.write(json.dumps({"step": step, "split": "validation", "cpu_s": step,
                                       "perplexity": result["val_perplexity"]}) + "\n")


def test_the_page_states_the_gate_and_shows_each_control_run(tmp_path):
    experiment = load(tmp_path)
    text = protocol_report.gate_text(experiment)
    assert text == ("\n\nGate, read before any claim: test mse / zero_mse <= 0.4 in every "
                    "reported seed of `attention`, each run converged; until it is met "
                    "every claim is not tested.")
    not_converged = {"converged": False, "reason": "9 evaluations (< 10)"}
    write_results(experiment, rows(attention1={"test_mse": 0.1},
                                   attention2={"convergence": not_converged}))
    anchors = {"4-gram": {"validation": {"perplexity": 9.0}, "test": {"perplexity": 9.0}}}
    page = open(protocol_report.page(experiment, str(tmp_path / "docs"), anchors,
                                     commit="abc", checkpoints=False)).read()
    pre_registered = page.split("## Pre-registered")[1].split("## Verdicts")[0]
    assert text.strip() in pre_registered
    verdicts = page.split("## Verdicts")[1].split("## Anchors")[0]
    assert ("Gate (test mse / zero_mse <= 0.4): **not met**.\n\n"
            "| control | seed | test mse / zero_mse | converged | passes |\n"
            "|---|---|---|---|---|\n"
            "| attention | 1 | 0.1 | yes | yes |\n"
            "| attention | 2 | 0.2 | no | **no** |\n") in verdicts
    assert ("**not tested**: gate not met: attention seed 2 did not converge (9 evaluations "
            "(< 10))") in verdicts
    plain = load_experiment(write(tmp_path), str(tmp_path / "runs"))
    assert protocol_report.gate_text(plain) == protocol_report.gate_table(plain, []) == ""
