"""The nearest-neighbour retrieval probe: its data, the nearest-neighbour anchors counted
by hand, the model's shapes and refusals, that it learns, its FLOP count, and its
configuration's checks."""

import math

import pytest

torch = pytest.importorskip("torch")
from subquad import data, models  # noqa: E402
from subquad.data.retrieval import RetrievalBatch  # noqa: E402
from subquad.experiments import anchors, flops  # noqa: E402
from subquad.train.config import ConfigError, resolve  # noqa: E402
from subquad.train.tasks import make_task  # noqa: E402


def draw(batch=64, keys=8, dims=5, noise=0.5, seed=0):
    return data.sample_sphere_retrieval(batch, keys, dims, noise,
                                        torch.Generator().manual_seed(seed))


def test_sequences_are_unit_keys_with_permuted_labels_and_a_query_near_its_key():
    batch = draw()
    assert batch.keys.shape == (64, 8, 5) and batch.queries.shape == (64, 5)
    torch.testing.assert_close(batch.keys.norm(dim=-1), torch.ones(64, 8))
    torch.testing.assert_close(batch.queries.norm(dim=-1), torch.ones(64))
    assert torch.equal(batch.labels.sort(dim=1).values, torch.arange(8).expand(64, 8))
    # The target is the label of the key the query copies: without noise, the query is it.
    clean = draw(noise=0.0)
    match = (clean.keys - clean.queries[:, None]).norm(dim=-1) < 1e-6
    assert torch.equal(match.sum(1), torch.ones(64, dtype=torch.int64))
    assert torch.equal(clean.labels[match], clean.targets)
    assert data.nearest_neighbour_accuracy(clean, 5) == 1.0
    # Deterministic in the generator, different across seeds.
    assert torch.equal(draw().queries, batch.queries)
    assert not torch.equal(draw(seed=1).queries, batch.queries)


@pytest.mark.parametrize("bad, match", [
    (dict(keys=1), "keys"), (dict(batch=0), "batch"), (dict(dims=0), "dims"),
    (dict(noise=-0.1), "noise"), (dict(noise=float("nan")), "noise"),
    (dict(noise=float("inf")), "noise")])
def test_bad_sizes_and_noise_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        draw(**bad)


def test_nearest_neighbour_in_r_coordinates_counted_by_hand():
    """Two sequences of three keys in R^2: by both coordinates the first query's nearest
    key is key 0 (label 2, the target); by the first coordinate alone it is key 1."""
    keys = torch.tensor([[[0.6, 0.8], [1.0, 0.0], [0.0, -1.0]],
                         [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]])
    labels = torch.tensor([[2, 0, 1], [0, 1, 2]])
    queries = torch.tensor([[0.5, 0.866], [0.1, 0.995]])
    batch = RetrievalBatch(keys, labels, queries, torch.tensor([2, 1]))
    assert data.nearest_neighbour_accuracy(batch, 2) == 1.0
    assert data.nearest_neighbour_accuracy(batch, 1) == 0.0  # keys 1 and 0 by x alone
    with pytest.raises(ValueError, match="rank: expected 1..2"):
        data.nearest_neighbour_accuracy(batch, 3)


def test_anchors_bracket_the_task_and_follow_the_config():
    settings = dict(dims=8, keys=16, noise=0.8, batch_size=128, eval_batches=2, seed=3)
    result = anchors.retrieval_references(**settings)
    assert result["chance"] == {"accuracy": 1 / 16, "loss": math.log(16)}
    levels = [result[f"nearest neighbour on {r} coordinates"]["accuracy"] for r in (2, 4)]
    full = result["nearest neighbour"]["accuracy"]
    assert 1 / 16 < levels[0] < levels[1] < full <= 1  # more coordinates, better retrieval
    assert "nearest neighbour on 8 coordinates" not in result  # that is all of them
    test = anchors.retrieval_references("test", **settings)
    assert test != result  # the test stream
    config = resolve({"run": {"family": "retrieval", "seed": 3},
                      "data": {"dims": 8, "keys": 16, "noise": 0.8},
                      "train": {"batch_size": 128, "eval_batches": 2}})
    assert anchors.for_config(config) == result


def test_the_model_reads_the_label_at_the_query_and_refuses_wrong_shapes():
    batch = draw(batch=4)
    model = models.NeighbourRetriever(5, 8, dim=16, heads=2)
    assert model(batch.keys, batch.labels, batch.queries).shape == (4, 8)
    for keys, labels, queries in ((batch.keys[:, :7], batch.labels, batch.queries),
                                  (batch.keys, batch.labels[:, :7], batch.queries),
                                  (batch.keys, batch.labels, batch.queries[:, :4]),
                                  (batch.keys[0], batch.labels, batch.queries)):
        with pytest.raises(ValueError, match=r"keys, labels, queries: expected \[B, 8, 5\]"):
            model(keys, labels, queries)
    with pytest.raises(ValueError, match="dims and keys"):
        models.NeighbourRetriever(5, 1)


def test_a_permutation_of_the_keys_does_not_change_the_answer():
    """The keys are a set: no positions, so reordering them (with their labels) leaves
    the logits as they were."""
    batch = draw(batch=3)
    model = models.NeighbourRetriever(5, 8, dim=16, heads=2).eval()
    order = torch.randperm(8, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(batch.keys[:, order], batch.labels[:, order],
                                     batch.queries),
                               model(batch.keys, batch.labels, batch.queries))


def config(**overrides):
    raw = {"run": {"family": "retrieval", "progress": False},
           "data": {"dims": 4, "keys": 4, "noise": 0.3},
           "model": {"dim": 16, "heads": 1, "layers": 1},
           "train": {"steps": 300, "batch_size": 64, "lr": 3e-3, "warmup": 10,
                     "eval_batches": 2}}
    for key, value in overrides.items():
        table, name = key.split(".")
        raw[table][name] = value
    return resolve(raw)


def test_the_task_trains_its_model_and_scores_both_splits():
    """An untrained model scores chance; AdamW on one fixed batch fits it (retrieval
    itself takes thousands of steps: the experiments show that); validation and test
    come from different streams."""
    torch.manual_seed(0)
    task = make_task(config())
    before = task.evaluate()
    assert before["loss"] == pytest.approx(math.log(4), rel=0.1)
    batch = task.batch(0)
    optimizer = torch.optim.AdamW(task.model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss, metrics = task.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.7 * losses[0], losses
    assert 0 <= metrics["accuracy"] <= 1
    assert task.evaluate("test") != task.evaluate()
    assert task.tokens(batch) == 64 * 5


def test_training_flops_count_the_readout_once_per_sequence():
    counter = flops.training_flop_counter(config())
    dim, keys, dims, hidden = 16, 4, 4, 64
    weights = dims * dim + 4 * dim * dim + 2 * dim * hidden
    tokens = keys + 1
    forward = (2 * weights * tokens + 2 * tokens * tokens * 1 * (2 * dim)
               + 2 * dim * keys)  # the readout: the query's row only
    assert counter(7) == 7 * 3 * 64 * forward


@pytest.mark.parametrize("key, value, match", [
    ("data.keys", 1, "data.keys: expected 2 to 4096"),
    ("data.noise", -1.0, "data.noise: expected >= 0"),
    ("train.eval_batches", 0, "train.eval_batches: expected > 0 for retrieval")])
def test_bad_settings_are_refused(key, value, match):
    with pytest.raises(ConfigError, match=match):
        config(**{key: value})
    with pytest.raises(ConfigError, match="data.points does not apply to family "
                                          "'retrieval'"):
        resolve({"run": {"family": "retrieval"}, "data": {"points": 3}})
