"""Language-model metrics of a compressed cache: plain and key-token ΔNLL and KL.

A document is C context tokens and T continuation tokens. The full cache's next-token
distributions over the continuation are the reference; a press's cache is scored on the
same T tokens teacher-forced. Per token t: nll_t = -log q_t(y_t), kl_t = KL(p_t || q_t).
Key tokens (LongPPL, arXiv 2410.23771): the continuation tokens whose log-probability
improves by more than `lsd` nats from a short window (the `short_window` tokens before
them, at least) to the full context, and whose full-context log-probability exceeds `lcl`
(LongPPL's alpha = 2, beta = -2). Cost: one [T, V] pass per press; the short window is
ceil(T / short_chunk) forwards of short_window + short_chunk tokens per document.
"""

from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import DynamicCache

__all__ = ["Reference", "continuation_logits", "key_tokens", "short_window_logprobs",
           "token_metrics"]


def key_tokens(full_logprob: Tensor, short_logprob: Tensor, lsd: float, lcl: float) -> Tensor:
    """[T] bool: LongPPL's key tokens, log p_full - log p_short > lsd and log p_full > lcl."""
    return ((full_logprob - short_logprob) > lsd) & (full_logprob > lcl)


def token_metrics(reference_logits: Tensor, logits: Tensor, targets: Tensor) -> Dict[str, Tensor]:
    """Per token (float64 [T]): nll of the targets under `logits`, KL(softmax(reference) ||
    softmax(logits)), and whether the two argmaxes agree. reference_logits, logits [T, V]."""
    log_p = F.log_softmax(reference_logits.double(), -1)  # [T, V]
    log_q = F.log_softmax(logits.double(), -1)  # [T, V]
    nll = -log_q.gather(1, targets[:, None].long())[:, 0]
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    top1 = (logits.argmax(-1) == reference_logits.argmax(-1)).double()
    return {"nll": nll, "kl": kl, "top1": top1}


@torch.no_grad()
def continuation_logits(model, cache, last_logits: Tensor, continuation: Tensor, context: int,
                        chunk: Optional[int] = None) -> Tensor:
    """[T, V] logits of the T continuation tokens teacher-forced after a cache of `context`
    positions (compressed or not): the first from the prefill's last position, the rest from
    forwards of `chunk` tokens (default: all T - 1 at once) at their original positions.
    Chunks keep kvpress's AdaKV working: it hides a head's pruned keys behind a fake key
    that every query of a forward must score below zero, which T - 1 queries in one
    forward may not allow."""
    rest = continuation[:-1]  # [T - 1]
    chunk = chunk or max(1, rest.shape[0])
    out = [last_logits[None].float()]
    for start in range(0, rest.shape[0], chunk):
        piece = rest[None, start:start + chunk]
        positions = torch.arange(context + start, context + start + piece.shape[1])[None]
        logits = model(input_ids=piece, past_key_values=cache, position_ids=positions).logits
        out.append(logits[0].float())
    return torch.cat(out, dim=0)


@torch.no_grad()
def short_window_logprobs(model, ids: Tensor, context: int, short_window: int,
                          short_chunk: int) -> Tensor:
    """[T] log-probabilities of the continuation tokens ids[context:] when each sees only the
    `short_window` to short_window + short_chunk - 1 tokens before it: the continuation
    in chunks of `short_chunk`, each a fresh forward from short_window tokens before it."""
    if not 0 < short_window <= context:
        raise ValueError(f"short_window: expected 1 .. context ({context}), got {short_window}")
    if short_chunk < 1:
        raise ValueError(f"short_chunk: expected >= 1, got {short_chunk}")
    total = ids.shape[0]
    out = []
    for start in range(context, total, short_chunk):
        stop = min(start + short_chunk, total)
        window = ids[start - short_window:stop][None]  # [1, short_window + chunk]
        logits = model(input_ids=window, past_key_values=DynamicCache()).logits[0]
        logits = logits[short_window - 1:-1].double()  # predicts ids[start:stop]
        out.append(F.log_softmax(logits, -1).gather(1, ids[start:stop, None])[:, 0])
    return torch.cat(out)


class Reference:
    """The full cache's distributions over one document's continuation, its key tokens, and
    the scoring of a press's logits against them."""

    def __init__(self, full_logits: Tensor, targets: Tensor, short_logprob: Tensor,
                 lsd: float, lcl: float):
        self.logits, self.targets = full_logits, targets
        full = token_metrics(full_logits, full_logits, targets)
        self.full_nll = full["nll"]  # [T]
        self.key = key_tokens(-full["nll"], short_logprob, lsd, lcl)  # [T] bool
        self.short_logprob = short_logprob

    def summary(self) -> Dict[str, float]:
        key = self.key
        return {"tokens": int(self.targets.shape[0]), "key_tokens": int(key.sum()),
                "full_nll": float(self.full_nll.mean()),
                "full_key_nll": _mean(self.full_nll, key),
                "short_nll": float(-self.short_logprob.mean()),
                "short_key_nll": _mean(-self.short_logprob, key)}

    def score(self, logits: Tensor) -> Dict[str, Optional[float]]:
        """ΔNLL, KL and top-1 agreement over all continuation tokens and over the key
        tokens (None when the document has none)."""
        m = token_metrics(self.logits, logits, self.targets)
        delta = m["nll"] - self.full_nll
        return {"delta_nll": float(delta.mean()), "kl": float(m["kl"].mean()),
                "top1": float(m["top1"].mean()), "key_delta_nll": _mean(delta, self.key),
                "key_kl": _mean(m["kl"], self.key)}


def _mean(values: Tensor, mask: Tensor) -> Optional[float]:
    return float(values[mask].mean()) if bool(mask.any()) else None


