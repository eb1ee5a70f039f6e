"""WildCat on real attention: Q/K/V of SmolLM2 blocks on real text as a workload.

`capture_qkv` runs a prefill and keeps the post-RoPE queries, keys and values of chosen
blocks ([1, N, H, D], [1, N, Hkv, D], [1, N, Hkv, D]). `save_workload` writes them as the
bench workload that `subquad bench --inputs smollm2` reads (generated on demand by
`subquad-llm capture`, into `default_workload_dir()`, never committed): a folder holding
q.npy [B, N, H, D], k.npy and v.npy [B, N, Hkv, D] (float32, one batch entry per captured
block), workload.json (model, text, window, blocks), and manifest.txt, written last: a line
"<sha256> <bytes> <file>" per file. A re-capture removes the manifest first, so one
interrupted between files leaves no manifest, and a folder whose files are not those its
manifest lists (mixed captures, an edited file) is refused by `load_workload` and by the
bench. `approximation_errors` compares
subquad.wildcat_attention (methods wildcat, uniform_nystrom, uniform_subsample) with
exact non-causal attention over the same inputs: relative Frobenius error per rank.
Unlike Gaussian inputs, where attention is nearly uniform and every method shows a
relative error of 0.7-0.8, real attention is peaked and the methods separate.
"""

import hashlib
import json
import os
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

__all__ = ["approximation_errors", "capture_qkv", "check_workload", "default_workload_dir",
           "load_workload", "save_workload"]

METHODS = ("wildcat", "uniform_nystrom", "uniform_subsample")
MANIFEST = "manifest.txt"
FILES = ("q.npy", "k.npy", "v.npy", "workload.json")


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
    manifest = os.path.join(directory, MANIFEST)
    if os.path.exists(manifest):  # from here until the new one is written, no workload
        os.remove(manifest)
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
    lines = ["# the files of this workload: sha256, bytes, name (subquad-llm capture)"]
    for name in FILES:
        digest, size = _digest(os.path.join(directory, name))
        lines.append(f"{digest} {size} {name}")
    with open(manifest + ".partial", "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(manifest + ".partial", manifest)
    return paths + [path, manifest]


def _digest(path: str):
    """(sha256 hex, bytes) of the file at `path`."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def check_workload(directory: str) -> None:
    """Raises ValueError unless `directory` holds a workload whose files are those its
    manifest lists (sizes and sha256)."""
    again = f"capture it again (subquad-llm capture --out {directory})"
    if not os.path.isfile(os.path.join(directory, "q.npy")):
        raise ValueError(f"{directory}: no captured workload (q.npy is missing); {again}")
    manifest = os.path.join(directory, MANIFEST)
    if not os.path.isfile(manifest):
        raise ValueError(f"{directory}: no manifest ({MANIFEST}): the capture was interrupted "
                         f"or predates manifests; {again}")
    listed = {}
    with open(manifest, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split()
            if len(fields) != 3 or len(fields[0]) != 64 or not fields[1].isdigit() or \
                    "/" in fields[2]:
                raise ValueError(f"{manifest}: line {number}: expected '<sha256> <bytes> "
                                 f"<file>', got {line.strip()!r}; {again}")
            listed[fields[2]] = (fields[0], int(fields[1]))
    for name in FILES:
        if name not in listed:
            raise ValueError(f"{manifest}: {name} is not listed; {again}")
    for name, (digest, size) in listed.items():
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise ValueError(f"{path} is missing (the manifest lists it); {again}")
        if _digest(path) != (digest, size):
            raise ValueError(f"{path} does not match its manifest (another size or sha256): the "
                             f"capture was interrupted or the files were changed; {again}")


def load_workload(directory: str) -> Dict[int, Dict[str, np.ndarray]]:
    """The inverse of `save_workload`: block -> {"q", "k", "v"} with a batch axis of 1,
    once the files are checked against the manifest (check_workload)."""
    check_workload(directory)
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
