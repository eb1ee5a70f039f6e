"""The evaluation protocol of KV-cache presses on a real model.

- `sliding_perplexity`: llama-perplexity's protocol: the text split into chunks of n_ctx
  tokens, each chunk a fresh forward, only its second half scored.
- `press_document`: prefill C context tokens, compress with each press at each ratio, then
  teacher-force the next `continuation` tokens; per (press, ratio) the mean NLL, the
  mean KL(full || press) of the next-token distributions, top-1 agreement with the full
  cache, and the kept bytes per block.
- `passkey_case`: the landmark passkey template (filler, "The pass key is N. Remember
  it.", filler; question appended after compression at the original positions), greedy
  answer, exact match.
- `bootstrap_ci`: percentile bootstrap over documents.
Results are plain dicts (one JSON line per document or case).
"""

import math
import random
import re
import time
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .presses import make_press

__all__ = ["PASSKEY_ANSWER_TOKENS", "PASSKEY_QUESTION", "PasskeyPrefix", "bootstrap_ci",
           "documents", "passkey_case", "passkey_min_length", "passkey_prompt", "press_document",
           "sliding_perplexity"]


@torch.no_grad()
def sliding_perplexity(model, ids: Sequence[int], n_ctx: int, *, max_chunks: Optional[int] = None,
                       progress=None) -> Dict[str, float]:
    """llama-perplexity: chunks [i n_ctx, (i + 1) n_ctx), tokens n_ctx/2 .. n_ctx - 1 of each
    scored (predicted from everything before them in the chunk)."""
    if n_ctx < 2:
        raise ValueError(f"n_ctx: expected >= 2, got {n_ctx}")
    if n_ctx > model.config.context_length:
        raise ValueError(f"n_ctx: {n_ctx} is more than the model's context length "
                         f"{model.config.context_length} (llama.context_length)")
    chunks = len(ids) // n_ctx
    if max_chunks is not None:
        chunks = min(chunks, max_chunks)
    if chunks == 0:
        raise ValueError(f"ids: {len(ids)} tokens, fewer than one chunk of {n_ctx}")
    first = n_ctx // 2
    total, count = 0.0, 0
    for chunk in range(chunks):
        window = torch.tensor([ids[chunk * n_ctx:(chunk + 1) * n_ctx]])
        logits = model.logits(window)[0].double()  # [n_ctx, V]
        nll = F.cross_entropy(logits[first - 1:-1], window[0, first:], reduction="sum")
        total, count = total + float(nll), count + n_ctx - first
        if progress is not None:
            progress(chunk + 1, chunks, math.exp(total / count))
    return {"n_ctx": n_ctx, "chunks": chunks, "scored_tokens": count,
            "nll": total / count, "perplexity": math.exp(total / count)}


def documents(ids: Sequence[int], length: int, count: int) -> List[List[int]]:
    """Up to `count` consecutive non-overlapping windows of `length` tokens."""
    available = len(ids) // length
    return [list(ids[i * length:(i + 1) * length]) for i in range(min(count, available))]


class _ReferenceDistribution:
    """The full cache's next-token distributions, computed once per document: every press
    is scored against them. reference [T, V] logits."""

    def __init__(self, reference: Tensor):
        log_ref = F.log_softmax(reference.double(), -1)  # [T, V]
        self.probs = log_ref.exp()  # [T, V]
        self.neg_entropy = (self.probs * log_ref).sum(-1)  # [T]: sum_v p log p
        self.mass = self.probs.sum(-1)  # [T]: 1 up to round-off
        self.top1 = reference.argmax(-1)  # [T]


def _distribution_metrics(reference: "_ReferenceDistribution", logits: Tensor,
                          targets: Tensor) -> Dict[str, float]:
    """logits [T, V]; targets [T] -> nll, kl(ref || logits), top-1 agreement.

    With x = logits and lse = logsumexp(x): log p = x - lse, so
    KL = sum_v p_ref (log p_ref - x + lse) = neg_entropy - p_ref . x + lse mass: one pass
    over [T, V] per press instead of a log-softmax and two products."""
    x = logits.double()  # [T, V]
    lse = torch.logsumexp(x, -1)  # [T]
    nll = (lse - x.gather(1, targets[:, None])[:, 0]).mean()
    cross = torch.bmm(reference.probs[:, None], x[:, :, None])[:, 0, 0]  # [T]: p_ref . x
    kl = reference.neg_entropy - cross + lse * reference.mass
    return {"nll": float(nll), "kl": float(kl.mean()),
            "top1": float((logits.argmax(-1) == reference.top1).double().mean())}


@torch.no_grad()
def press_document(model, ids: Sequence[int], context: int, continuation: int,
                   presses: Iterable[str], ratios: Iterable[float], seed: int = 0) -> Dict:
    """One document of context + continuation tokens: see the module docstring."""
    ids = torch.tensor([list(ids)])
    if ids.shape[1] != context + continuation:
        raise ValueError(f"ids: expected {context + continuation} tokens, got {ids.shape[1]}")
    prompt, targets = ids[:, :context], ids[0, context:]
    cache = model.new_cache(1)
    start = time.perf_counter()
    first_logits = model.prefill(prompt, cache)  # [1, V]: predicts targets[0]
    prefill_s = time.perf_counter() - start

    def continue_from(press_cache) -> torch.Tensor:  # [continuation, V]
        rest = model.step(ids[:, context:-1], press_cache)[0]
        return torch.cat([first_logits, rest], dim=0)

    reference_logits = continue_from(cache.clone())  # [continuation, V]
    reference = _ReferenceDistribution(reference_logits)
    full = _distribution_metrics(reference, reference_logits, targets)
    result = {"context": context, "continuation": continuation, "prefill_s": prefill_s,
              "full_nll": full["nll"], "full_bytes_per_block": cache.layers[0].nbytes,
              "runs": []}
    for name in presses:
        for ratio in ratios:
            press_cache = cache.clone()
            press = make_press(name, ratio, seed)
            start = time.perf_counter()
            press(press_cache)
            compress_s = time.perf_counter() - start
            kept = press_cache.lengths[0]
            bytes_per_block = [layer.nbytes for layer in press_cache.layers]
            metrics = _distribution_metrics(reference, continue_from(press_cache), targets)
            result["runs"].append({
                "press": name, "ratio": ratio, "kept_per_head": kept,
                "bytes_per_block": int(np.mean(bytes_per_block)),
                "compress_s": compress_s, "delta_nll": metrics["nll"] - full["nll"],
                **metrics, **{f"stat_{k}": v for k, v in press.stats.items()}})
    return result


PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
                 "memorize it. I will quiz you about the important information there.\n")
PASSKEY_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and "
                  "back again. ")
PASSKEY_QUESTION = "\nWhat is the pass key? The pass key is"
PASSKEY_ANSWER_TOKENS = 8  # greedy tokens decoded for the answer (at most)


def _passkey_parts(model, length: int, depth: float, key: int):
    """(context ids, shared): the context of `passkey_prompt`, and how many of its first
    tokens are the same in every prompt (intro + filler up to the needle)."""
    needle = model.tokenize(f"The pass key is {key}. Remember it. {key} is the pass key.\n")
    intro = model.tokenize(PASSKEY_INTRO)
    filler_unit = model.tokenize(PASSKEY_FILLER)
    question = model.tokenize(PASSKEY_QUESTION)
    room = length - len(intro) - len(needle) - len(question)
    if room < 0:
        raise ValueError(f"length: {length} tokens cannot hold the template")
    filler = (filler_unit * (room // len(filler_unit) + 1))[:room]
    # Cut the filler at a sentence boundary so the needle starts a sentence.
    cut = int(round(depth * room))
    period = model.tokenize(".")[0]
    while 0 < cut < room and filler[cut - 1] != period:
        cut -= 1
    return intro + filler[:cut] + needle + filler[cut:], len(intro) + cut


def passkey_min_length(model) -> int:
    """The fewest tokens a passkey prompt can have: intro, needle and question, no filler
    (keys have five digits, and the tokenizer splits digits one by one, so every needle
    has the same length)."""
    needle = model.tokenize("The pass key is 10000. Remember it. 10000 is the pass key.\n")
    return (len(model.tokenize(PASSKEY_INTRO)) + len(needle)
            + len(model.tokenize(PASSKEY_QUESTION)))


def passkey_prompt(model, length: int, depth: float, key: int) -> List[int]:
    """Token ids of about `length` tokens: intro, filler, the key sentence at `depth`
    (0 = start of the filler, 1 = its end), filler; the question is separate."""
    return _passkey_parts(model, length, depth, key)[0]


class PasskeyPrefix:
    """The cache of the text every passkey prompt starts with (the intro, then the filler
    repeated), prefilled once for `length` tokens and extended when a longer prompt needs
    more (the text is a prefix of itself made longer). A prompt's context
    cache is a copy rolled back to the needle, then only the rest is prefilled: causal
    attention makes the shared tokens' keys and values independent of what follows.
    At least the last token is prefilled again: its logits start the answer."""

    def __init__(self, model, length: int):
        self.model = model
        self.ids: List[int] = []
        self.cache = model.new_cache(1)
        self._extend(length)

    def _extend(self, length: int) -> None:
        if length <= len(self.ids):
            return
        filler_unit = self.model.tokenize(PASSKEY_FILLER)
        ids = self.model.tokenize(PASSKEY_INTRO) + filler_unit * (length // len(filler_unit) + 1)
        ids = ids[:length]
        with torch.no_grad():
            self.model.prefill(torch.tensor([ids[len(self.ids):]]), self.cache)
        self.ids = ids

    def context_cache(self, context: List[int], shared: int):
        """A cache holding `context` (whose first `shared` tokens are the prefix's);
        returns (cache, last-token logits [1, V])."""
        reuse = min(shared, len(context) - 1)
        self._extend(reuse)
        if context[:reuse] != self.ids[:reuse]:
            raise ValueError("context: does not start with the passkey prefix")
        cache = self.cache.clone()
        cache.truncate(reuse)
        with torch.no_grad():
            logits = self.model.prefill(torch.tensor([context[reuse:]]), cache)
        return cache, logits


@torch.no_grad()
def passkey_case(model, length: int, depth: float, seed: int, presses: Iterable[str],
                 ratios: Iterable[float], answer_tokens: int = PASSKEY_ANSWER_TOKENS,
                 skip_presses_on_miss: bool = False,
                 prefix: Optional[PasskeyPrefix] = None) -> Dict:
    """One passkey prompt: full cache and every (press, ratio); exact match of the key.
    With `skip_presses_on_miss`, a prompt the full cache gets wrong runs no press (its
    record says `presses_skipped`): the presses are scored where the full cache succeeds.
    `prefix` (a PasskeyPrefix) saves prefilling the shared start of the prompt. The
    presses of one ratio are decoded as one batch (`model.step_each`): the weights are read
    once per step for all of them, and only that ratio's caches are held at once. Either
    saving gives the plain computation's answers up to round-off (a batched float32 GEMM
    may round differently from one row; a near-tie can then flip a greedy token)."""
    if isinstance(answer_tokens, bool) or not isinstance(answer_tokens, int) or answer_tokens < 1:
        raise ValueError(f"answer_tokens: expected an integer >= 1, got {answer_tokens!r}")
    if not 0.0 <= depth <= 1.0:  # also NaN
        raise ValueError(f"depth: expected a fraction of the filler in [0, 1], got {depth!r}")
    if length + answer_tokens - 1 > model.config.context_length:
        raise ValueError(f"length: a prompt of {length} tokens and a {answer_tokens}-token "
                         f"answer need more than the model's context length "
                         f"{model.config.context_length} (llama.context_length)")
    rng = random.Random(seed * 7919 + int(depth * 100) + length)
    key = rng.randrange(10000, 100000)
    context, shared = _passkey_parts(model, length, depth, key)
    question = model.tokenize(PASSKEY_QUESTION)
    if prefix is not None:
        cache, _ = prefix.context_cache(context, shared)
    else:
        cache = model.new_cache(1)
        model.prefill(torch.tensor([context]), cache)

    def answers(caches: List) -> List[str]:
        """The greedy answer after each cache, all decoded as one batch (model.step_each);
        a row's answer ends at a number followed by anything else, or at answer_tokens."""
        logits = model.step_each(torch.tensor([question] * len(caches)), caches)[:, -1]
        new: List[List[int]] = [[] for _ in caches]
        done = [False] * len(caches)
        while True:
            tokens = logits.argmax(-1)
            for row, token in enumerate(tokens.tolist()):
                if not done[row]:
                    new[row].append(token)
                    done[row] = (re.search(r"\d\D", model.detokenize(new[row])) is not None
                                 or len(new[row]) == answer_tokens)
            if all(done):
                return [model.detokenize(ids) for ids in new]
            logits = model.step_each(tokens[:, None], caches)[:, -1]

    def correct(text: str) -> bool:
        found = re.search(r"\d+", text)
        return found is not None and int(found.group()) == key

    full, = answers([cache.clone()])
    result = {"length": length, "tokens": len(context) + len(question), "depth": depth,
              "seed": seed, "key": key, "full_answer": full, "full_correct": correct(full),
              "runs": []}
    if skip_presses_on_miss and not result["full_correct"]:
        result["presses_skipped"] = True
        return result
    presses, ratios, answered = list(presses), list(ratios), {}
    for ratio in ratios if presses else []:  # step_each needs at least one cache
        press_caches = []
        for name in presses:
            press_caches.append(cache.clone())
            make_press(name, ratio, seed)(press_caches[-1])
        answered.update(((name, ratio), text)
                        for name, text in zip(presses, answers(press_caches)))
    result["runs"] = [{"press": name, "ratio": ratio, "answer": answered[name, ratio],
                       "correct": correct(answered[name, ratio])}
                      for name in presses for ratio in ratios]
    return result


def bootstrap_ci(values: Sequence[float], resamples: int = 2000, level: float = 0.95,
                 seed: int = 0):
    """(mean, low, high): percentile bootstrap of the mean over the given values."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("values: expected at least one value")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, (resamples, values.size))].mean(1)
    tail = (1 - level) / 2 * 100
    return float(values.mean()), float(np.percentile(means, tail)), float(
        np.percentile(means, 100 - tail))
