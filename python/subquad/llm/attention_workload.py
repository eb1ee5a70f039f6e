"""WildCat on real attention: Q/K/V of SmolLM2 blocks on real text as a workload.

`capture_qkv` runs a prefill and keeps the post-RoPE queries, keys and values of chosen
blocks ([1, N, H, D], [1, N, Hkv, D], [1, N, Hkv, D]). `save_workload` writes them as the
bench workload that `subquad bench --inputs smollm2` reads (generated on demand by
`subquad-llm capture`, into `default_workload_dir()`, never committed): a folder holding
q.npy [B, N, H, D], k.npy and v.npy [B, N, Hkv, D] (float32, one batch entry per captured
block) and workload.json (model, text, window, blocks). `approximation_errors` compares
subquad.wildcat_attention (methods wildcat, uniform_nystrom, uniform_subsample) with
exact non-causal attention over the same inputs: relative Frobenius error per rank.
Unlike Gaussian inputs, where attention is nearly uniform and every method shows a
relative error of 0.7-0.8, real attention is peaked and the methods separate.
"""

import json
import os
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

__all__ = ["approximation_errors", "capture_qkv", "default_workload_dir", "load_workload",
           "save_workload"]

METHODS = ("wildcat", "uniform_nystrom", "uniform_subsample")


@torch.no_grad()
def capture_qkv(model, ids: Sequence[int], blocks: Sequence[int],
                progress: Optional[Callable[[int], None]] = None) -> Dict[int, Dict[str, np.ndarray]]:
    """Block -> {"q" [1, N, H, D], "k", "v" [1, N, Hkv, D]} float32 arrays of a causal
    forward of `ids` (post-RoPE q and k, as attention sees them). progress(block), when
    given, is called as each block starts."""
    blocks, out = set(blocks), {}

    def observe(block, q, k, v):
        if progress is not None:
            progress(block)
        if block in blocks:
            out[block] = {name: t.float().numpy().copy() for name, t in
                          (("q", q), ("k", k), ("v", v))}

    model._forward(torch.tensor([list(ids)]), 0, None, all_logits=False, observe=observe)
    return out


def default_workload_dir() -> str:
    """Where `subquad-llm capture` writes and `subquad bench` looks: $SUBQUAD_WORKLOAD_DIR,
    else $XDG_CACHE_HOME/subquad/smollm2, else ~/.cache/subquad/smollm2 (the C++ CLI
    resolves the same order)."""
    if os.environ.get("SUBQUAD_WORKLOAD_DIR"):
        return os.environ["SUBQUAD_WORKLOAD_DIR"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "subquad", "smollm2")


def save_workload(captured, directory: str, meta: Optional[Dict] = None) -> List[str]:
    """The captured blocks stacked on the batch axis, in block order: q.npy [B, N, H, D],
    k.npy and v.npy [B, N, Hkv, D] float32, and workload.json. Each file is written under a
    temporary name and renamed, so an interrupted capture leaves no half-written array."""
    if not captured:
        raise ValueError("captured: expected at least one block")
    os.makedirs(directory, exist_ok=True)
    blocks = sorted(captured)
    paths = []
    for name in ("q", "k", "v"):
        stacked = np.concatenate([captured[b][name] for b in blocks], axis=0).astype(np.float32)
        path = os.path.join(directory, f"{name}.npy")
        with open(path + ".partial", "wb") as handle:
            np.save(handle, np.ascontiguousarray(stacked))
        os.replace(path + ".partial", path)
        paths.append(path)
    q = captured[blocks[0]]["q"]
    info = {"blocks": blocks, "tokens": int(q.shape[1]), "heads": int(q.shape[2]),
            "kv_heads": int(captured[blocks[0]]["k"].shape[2]), "head_dim": int(q.shape[3]),
            **(meta or {})}
    path = os.path.join(directory, "workload.json")
    with open(path + ".partial", "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=1)
    os.replace(path + ".partial", path)
    return paths + [path]


def load_workload(directory: str) -> Dict[int, Dict[str, np.ndarray]]:
    """The inverse of `save_workload`: block -> {"q", "k", "v"} with a batch axis of 1."""
    with open(os.path.join(directory, "workload.json"), encoding="utf-8") as handle:
        info = json.load(handle)
    arrays = {name: np.load(os.path.join(directory, f"{name}.npy")) for name in ("q", "k", "v")}
    if any(a.shape[0] != len(info["blocks"]) for a in arrays.values()):
        raise ValueError(f"{directory}: arrays hold {arrays['q'].shape[0]} blocks, workload.json "
                         f"lists {len(info['blocks'])}")
    return {block: {name: a[i:i + 1] for name, a in arrays.items()}
            for i, block in enumerate(info["blocks"])}


def approximation_errors(captured, ranks: Sequence[int], seeds: Sequence[int] = (0, 1, 2),
                         bins: int = 1) -> List[Dict]:
    """Rows {block, method, rank, rel_error (mean over seeds), spread} against exact
    non-causal attention of the same q, k, v."""
    import subquad

    rows = []
    for block, t in captured.items():
        q, k, v = (np.ascontiguousarray(t[n], dtype=np.float32) for n in ("q", "k", "v"))
        exact, _ = subquad.exact_attention_forward(q.astype(np.float64), k.astype(np.float64),
                                                   v.astype(np.float64))
        norm = np.linalg.norm(exact)
        for method in METHODS:
            for rank in ranks:
                errors = [np.linalg.norm(subquad.wildcat_attention(
                    q, k, v, rank=rank, bins=bins, seed=seed, method=method) - exact) / norm
                    for seed in seeds]
                rows.append({"block": block, "method": method, "rank": rank,
                             "rel_error": float(np.mean(errors)),
                             "spread": float(np.max(errors) - np.min(errors))})
    return rows
