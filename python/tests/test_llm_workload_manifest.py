"""The captured workload's manifest (written last, sizes and sha256): a re-capture
interrupted between files, or files mixed from two captures, never load as a workload
(the bench's reader is tested by tests/cli_workload_test.py)."""

import os

import numpy as np
import pytest

pytest.importorskip("torch")

from subquad.llm import attention_workload  # noqa: E402


def _captured(seed, tokens=12):
    rng = np.random.default_rng(seed)
    return {0: {name: rng.standard_normal((1, tokens, heads, 8)).astype(np.float32)
                for name, heads in (("q", 4), ("k", 2), ("v", 2))}}


def test_interrupted_recapture_leaves_no_loadable_workload(tmp_path, monkeypatch):
    attention_workload.save_workload(_captured(0), str(tmp_path))
    first = attention_workload.load_workload(str(tmp_path))
    replace = os.replace

    def crash_at_v(source, target):
        if target.endswith("v.npy"):
            raise KeyboardInterrupt
        replace(source, target)

    monkeypatch.setattr(attention_workload.os, "replace", crash_at_v)
    with pytest.raises(KeyboardInterrupt):  # q.npy and k.npy are the new capture's
        attention_workload.save_workload(_captured(1), str(tmp_path))
    monkeypatch.setattr(attention_workload.os, "replace", replace)
    with pytest.raises(ValueError, match="no manifest .*interrupted"):
        attention_workload.load_workload(str(tmp_path))
    # A manifest from the first capture beside the second capture's k.npy: refused too.
    attention_workload.save_workload(_captured(0), str(tmp_path))
    np.testing.assert_array_equal(attention_workload.load_workload(str(tmp_path))[0]["k"],
                                  first[0]["k"])
    other = tmp_path / "other"
    attention_workload.save_workload(_captured(1), str(other))
    os.replace(other / "k.npy", tmp_path / "k.npy")
    with pytest.raises(ValueError, match=r"k.npy does not match its manifest"):
        attention_workload.load_workload(str(tmp_path))
    manifest = (tmp_path / "manifest.txt").read_text().splitlines()
    assert [line.split()[2] for line in manifest[1:]] == ["q.npy", "k.npy", "v.npy",
                                                         "workload.json"]
