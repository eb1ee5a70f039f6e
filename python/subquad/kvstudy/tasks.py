"""Retrieval tasks in natural haystacks, generated here: needle-in-a-haystack at a depth, and
RULER-style (arXiv 2404.06654) multi-key, multi-value and variable-tracking tasks.

A task is C context tokens (a passage of a book or dictionary with the needles inserted at
sentence boundaries), a question appended after the context (after compression) and the
answers to find in the greedy continuation. Each needle's value is drawn again until the
context holds it exactly once, so a correct answer can only come from the needle.
Scores: niah and multikey, 1 when the first number answered is the value (else 0);
multivalue, the fraction of the values answered; vartrack, the fraction of the chain's
variables answered.
"""

import random
import re
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

__all__ = ["KINDS", "Haystack", "Task", "make_task", "score_answer", "stop_decoding"]

KINDS = ("niah", "multikey", "multivalue", "vartrack")
# Keys of the magic numbers: common words, so a small model's tokenizer splits them little.
KEY_WORDS = ("apple", "river", "candle", "garden", "silver", "window", "thunder", "meadow",
             "lantern", "harbor", "falcon", "marble", "orchard", "velvet", "compass", "glacier",
             "saddle", "pepper", "violin", "anchor", "blossom", "copper", "feather", "island")
VALUE_LOW, VALUE_HIGH = 1_000_000, 10_000_000  # seven-digit values
NAME_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
NAME_LENGTH = 5
MAX_DRAWS = 100  # redraws of a value that already occurs in the passage
SLACK = 64  # passage tokens beyond the context checked for the values (needles take room)


class Haystack:
    """A long text as token ids, and which token positions start a sentence (a needle is
    inserted there): positions right after a token whose text ends with . ! ? or a newline."""

    def __init__(self, name: str, text: str, tokenizer):
        self.name = name
        self.ids = tokenizer.tokenize(text, add_bos=False)
        ends = {t for t in set(self.ids) if _ends_sentence(tokenizer.detokenize([t]))}
        self.starts = [i + 1 for i, t in enumerate(self.ids) if t in ends]


def _ends_sentence(text: str) -> bool:
    return "\n" in text or text.rstrip().endswith((".", "!", "?"))


@dataclass
class Task:
    kind: str
    haystack: str
    length: int
    depth: Optional[float]
    seed: int
    context: List[int]  # C token ids
    question: List[int]
    answers: List[str]  # what a correct answer names (numbers or variable names)
    max_new_tokens: int
    needle_positions: List[int] = field(default_factory=list)  # token offsets in context


def _value(rng: random.Random, taken: Sequence[str], passage: str) -> str:
    for _ in range(MAX_DRAWS):
        value = str(rng.randrange(VALUE_LOW, VALUE_HIGH))
        if value not in taken and value not in passage:
            return value
    raise RuntimeError("no seven-digit value absent from the passage in 100 draws")


def _name(rng: random.Random, taken: Sequence[str], passage: str) -> str:
    for _ in range(MAX_DRAWS):
        name = "".join(rng.choice(NAME_LETTERS) for _ in range(NAME_LENGTH))
        if name not in taken and not re.search(rf"\b{name}\b", passage):
            return name
    raise RuntimeError("no variable name absent from the passage in 100 draws")


def make_task(kind: str, haystack: Haystack, tokenizer, length: int, depth: Optional[float],
              seed: int, keys: int = 4, values: int = 4, hops: int = 4) -> Task:
    """One task of `length` context tokens. niah: one needle at `depth` (0 = the passage's
    start, 1 = its end); multikey: the queried needle at `depth` and keys - 1 others at
    random sentence starts; multivalue: `values` needles of one key; vartrack: a chain of
    `hops` assignments, in order, at random sentence starts."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    if depth is not None and not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth: expected a fraction in [0, 1], got {depth!r}")
    rng = random.Random(f"{kind}/{haystack.name}/{length}/{depth}/{seed}")
    words = rng.sample(KEY_WORDS, keys if kind == "multikey" else 1)
    sizes = {"niah": 1, "multikey": keys, "multivalue": values, "vartrack": 1}[kind]
    if length + SLACK >= len(haystack.ids):
        raise ValueError(f"length: {length} tokens is not less than {haystack.name!r} "
                         f"({len(haystack.ids)} tokens) minus {SLACK}")
    start = rng.randrange(0, len(haystack.ids) - length - SLACK)
    # Values and names absent from every passage the needles could leave room for.
    text = tokenizer.detokenize(haystack.ids[start:start + length + SLACK])
    answers: List[str] = []
    for _ in range(sizes):
        answers.append(_value(rng, answers, text))
    names: List[str] = []
    for _ in range(hops if kind == "vartrack" else 0):
        names.append(_name(rng, names, text))
    needles = _needles(kind, words, answers, names)
    room = length - sum(len(tokenizer.tokenize(n, add_bos=False)) for n in needles)
    if room < 1:
        raise ValueError(f"length: {length} tokens cannot hold the {kind} needles")
    passage = haystack.ids[start:start + room]
    starts = [s - start for s in haystack.starts if start < s < start + room] or [0]
    if kind in ("niah", "multikey"):
        target = round(depth * room) if depth is not None else rng.randrange(room + 1)
        cuts = [max([s for s in starts if s <= target] or [0])]
        cuts += [rng.choice(starts) for _ in needles[1:]]
    else:
        cuts = sorted(rng.choice(starts) for _ in needles)
    order = sorted(range(len(needles)), key=lambda i: (cuts[i], i))
    if kind in ("multivalue", "vartrack"):
        order = list(range(len(needles)))  # cuts are sorted: the chain stays in order
    context, last, positions = [], 0, [0] * len(needles)
    for i in order:
        context += passage[last:cuts[i]]
        positions[i] = len(context)
        context += tokenizer.tokenize(needles[i], add_bos=False)
        last = cuts[i]
    context += passage[last:]
    question, answer_list, max_new = _question(kind, words, answers, names, hops)
    return Task(kind, haystack.name, length, depth, seed, context,
                tokenizer.tokenize(question, add_bos=False), answer_list, max_new, positions)


def _needles(kind: str, words, values, names) -> List[str]:
    if kind in ("niah", "multikey"):
        return [f" The special magic number for {w} is: {v}. " for w, v in zip(words, values)]
    if kind == "multivalue":
        return [f" One of the special magic numbers for {words[0]} is: {v}. " for v in values]
    chain = [f" VAR {names[0]} = {values[0]}. "]
    return chain + [f" VAR {names[i]} = VAR {names[i - 1]}. " for i in range(1, len(names))]


def _question(kind: str, words, values, names, hops: int):
    if kind in ("niah", "multikey"):
        key = words[0]
        return (f"\nWhat is the special magic number for {key} mentioned in the text above? "
                f"The special magic number for {key} is:", [values[0]], 10)
    if kind == "multivalue":
        key = words[0]
        return (f"\nWhat are all the special magic numbers for {key} mentioned in the text "
                f"above? The special magic numbers for {key} are:", list(values),
                10 * len(values))
    chain = list(names)
    return (f"\nQuestion: Find all variables that are assigned the value {values[0]} in the "
            f"text above. Answer: According to the chain of variable assignment in the text "
            f"above, {hops} variables are assigned the value {values[0]}, they are:",
            chain, 4 * hops + 4)


def score_answer(task: Task, text: str) -> float:
    """The task's score of a generated answer (see the module docstring)."""
    if task.kind in ("niah", "multikey"):
        found = re.search(r"\d+", text)
        return float(found is not None and found.group() == task.answers[0])
    if task.kind == "multivalue":
        said = set(re.findall(r"\d+", text))
    else:
        said = set(re.findall(r"[A-Z]+", text))
    return sum(a in said for a in task.answers) / len(task.answers)


def stop_decoding(task: Task, text: str) -> bool:
    """Whether a greedy answer is complete: a number followed by something else (niah,
    multikey), or a newline after some text (multivalue, vartrack)."""
    if task.kind in ("niah", "multikey"):
        return re.search(r"\d\D", text) is not None
    return "\n" in text.lstrip()
