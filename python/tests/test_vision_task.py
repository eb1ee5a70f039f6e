"""The vit family's protocol split (validation on held-out training images, never trained
on; test on all 10,000) and its light augmentation (shifts of <= 2 pixels, flips)."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from subquad.data import fashion_mnist  # noqa: E402
from subquad.experiments import anchors  # noqa: E402
from subquad.train.config import ConfigError, resolve  # noqa: E402
from subquad.train.tasks import SHIFT, augment, make_task  # noqa: E402

needs_data = pytest.mark.skipif(not os.path.exists(fashion_mnist.DIRECTORY),
                                reason=f"{fashion_mnist.PACKAGE} missing "
                                       f"(scripts/install.sh installs it)")


def vit_config(**data):
    return resolve({"run": {"family": "vit"}, "data": data,
                    "model": {"dim": 16, "heads": 2, "layers": 1, "patch": 7},
                    "train": {"batch_size": 512}})


def test_a_shift_moves_every_pixel_by_the_same_amount_within_the_border():
    """One bright pixel per image: after augment it lies at most SHIFT pixels away (its
    row; its column mirrored when flipped), and the rest is background."""
    images = torch.full((200, 1, 28, 28), -1.0)
    images[:, 0, 10, 6] = 5.0
    moved = augment(images, -1.0, torch.Generator().manual_seed(0))
    assert moved.shape == images.shape
    bright = (moved[:, 0] == 5.0).nonzero()
    assert len(bright) == 200 and torch.equal(bright[:, 0], torch.arange(200))
    rows, cols = bright[:, 1], bright[:, 2]
    assert int((rows - 10).abs().max()) <= SHIFT
    unflipped, flipped = (cols - 6).abs() <= SHIFT, (cols - 21).abs() <= SHIFT
    assert bool((unflipped | flipped).all()) and unflipped.any() and flipped.any()
    assert set((rows - 10).tolist()) == set(range(-SHIFT, SHIFT + 1))
    assert int((moved == -1.0).sum()) == 200 * (28 * 28 - 1)  # the border is background
    again = augment(images, -1.0, torch.Generator().manual_seed(0))
    assert torch.equal(moved, again)  # a function of the generator: resumes draw the same


@needs_data
def test_validation_is_held_out_training_images_and_test_is_all_of_them():
    images, labels = fashion_mnist.load_fashion_mnist("train")
    task = make_task(vit_config(validation_size=5000, augment=True))
    assert len(task.images) == 55000 and torch.equal(task.labels,
                                                     torch.from_numpy(labels[:55000]))
    held_images, held_labels = task.split_data("validation")
    assert torch.equal(held_labels, torch.from_numpy(labels[55000:]))
    pixels = images[:55000].astype(np.float32) / 255  # standardised by the trained part
    expected = (images[55000:].astype(np.float32) / 255 - pixels.mean()) / pixels.std()
    torch.testing.assert_close(held_images[:, 0], torch.from_numpy(expected))
    test_images, test_labels = task.split_data("test")
    assert len(test_labels) == 10000
    batch_images, _ = task.batch(3)
    assert batch_images.shape == (512, 1, 28, 28)
    assert not torch.equal(batch_images, task.images[:512])
    result = task.evaluate()
    assert set(result) == {"loss", "accuracy"} and 0 <= result["accuracy"] <= 1
    # Without validation_size (older configurations): the first eval_size test images.
    old = make_task(vit_config(eval_size=300))
    assert len(old.images) == 60000 and len(old.split_data("validation")[1]) == 300


@pytest.mark.parametrize("data, match", [
    (dict(validation_size=40000), "data.validation_size: expected 0"),
    (dict(validation_size=-1), "data.validation_size: expected 0"),
    (dict(validation_size=5000, train_size=58000), "data.train_size \\+ "
                                                   "data.validation_size")])
def test_bad_splits_are_refused(data, match):
    with pytest.raises(ConfigError, match=match):
        vit_config(**data)


def test_the_anchors_follow_the_held_out_validation(monkeypatch):
    calls = []
    monkeypatch.setattr(anchors, "fashion_mnist_anchors",
                        lambda split, **settings: calls.append((split, settings)) or {})
    anchors.for_config(vit_config(validation_size=3000), "validation")
    anchors.for_config(vit_config(eval_size=300), "test")
    assert calls == [("validation", dict(validation_size=3000, held_out_validation=True)),
                     ("test", dict(eval_size=300))]
