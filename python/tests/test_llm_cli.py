"""subquad-llm eval-press's bookkeeping: documents from several held-out texts, the records
naming text and window, resuming from the output file, the deadline. The model and the
per-document evaluation are stand-ins (their own tests are test_llm_model.py and
test_llm_real.py); this checks only what the command adds."""

import json
import types

import pytest

pytest.importorskip("torch")

from subquad.llm import cli, evaluation  # noqa: E402


class _CharModel:
    config = types.SimpleNamespace(context_length=512)

    def tokenize(self, text):
        return [ord(c) for c in text]


@pytest.fixture
def fake(monkeypatch):
    calls = []

    def press_document(model, doc, context, continuation, presses, ratios, seed):
        calls.append(("".join(map(chr, doc)), seed))
        return {"context": context, "continuation": continuation, "full_nll": 0.0, "runs": []}

    monkeypatch.setattr(cli, "_model", lambda args: _CharModel())
    monkeypatch.setattr(evaluation, "press_document", press_document)
    monkeypatch.setitem(cli.PACKAGE_TEXTS, "persuasion", lambda: "aaaabbbbcc")  # 2 windows
    monkeypatch.setitem(cli.PACKAGE_TEXTS, "mobydick", lambda: "xxxxyyyyzzzz")  # 3 windows
    return calls


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_documents_are_each_texts_windows_in_turn_and_resume(tmp_path, fake):
    out = tmp_path / "press.jsonl"
    argv = ["eval-press", "--context", "3", "--continuation", "1", "--docs", "4", "--texts",
            "persuasion", "mobydick", "--out", str(out)]
    cli.main(argv)
    assert fake == [("aaaa", 0), ("bbbb", 1), ("xxxx", 2), ("yyyy", 3)]
    assert [(r["doc"], r["text"], r["window"]) for r in _records(out)] == [
        (0, "persuasion", 0), (1, "persuasion", 1), (2, "mobydick", 0), (3, "mobydick", 1)]
    fake.clear()
    cli.main(argv[:6] + ["5"] + argv[7:])  # --docs 5: only the new document runs
    assert fake == [("zzzz", 4)] and len(_records(out)) == 5


def test_deadline_in_the_past_starts_nothing_after_the_first_document(tmp_path, fake):
    out = tmp_path / "press.jsonl"
    cli.main(["eval-press", "--context", "3", "--continuation", "1", "--texts", "mobydick",
              "--deadline", "1", "--out", str(out)])
    assert fake == []  # time.time() + 0 > 1: not even the first one
    assert not out.exists()
