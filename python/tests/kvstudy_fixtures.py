"""Fixtures of the kvstudy tests: a tiny random Llama with the "subquad" attention, a
character tokenizer, synthetic texts under the study's text names, and a small config."""

import random

import torch

WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "from",
         "old", "house", "by", "river", "under", "tree", "she", "said", "it", "was", "cold")


class CharTokenizer:
    """One token per ASCII character (others become "?"); no BOS, no EOS."""

    eos_id = None

    def tokenize(self, text, add_bos=False):
        return [ord(ch) if ord(ch) < 128 else ord("?") for ch in text]

    def detokenize(self, ids):
        return "".join(chr(int(i)) for i in ids)


def synthetic_text(seed: int, sentences: int = 400) -> str:
    rng = random.Random(seed)
    out = []
    for _ in range(sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randrange(3, 9))]
        out.append(" ".join(words).capitalize() + rng.choice([".", ".", "!", "?"]))
    return " ".join(out)


TEXTS = {"persuasion": synthetic_text(1), "mobydick": synthetic_text(2),
         "emma": synthetic_text(3), "gcide": "\n\n".join(synthetic_text(4, 300).split(". "))}


def tiny_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    from subquad.kvstudy.presses import register_attention

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, rope_theta=10000.0,
                         attn_implementation=register_attention())
    model = LlamaForCausalLM(config).eval()
    # Larger weights than the default init, so that attention is not uniform and the
    # presses' choices matter to the logits.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(8.0)
    return model


def config_data(out: str) -> dict:
    return {
        "study": {"name": "fixture", "out": out, "pilot": True, "threads": 1, "seed": 0},
        "claim": {"text": "fixture", "press": "compresskv",
                  "baselines": ["streaming_llm", "knorm", "snapkv"], "ratio": 0.5,
                  "context": 48, "metric": "key_delta_nll"},
        "lm": {"context": 48, "continuation": 16, "short_window": 8, "short_chunk": 8,
               "key_lsd": 0.05, "key_lcl": -10.0, "score_chunk": 4,
               "book": [{"name": "persuasion", "tune": [5], "evaluate": [0, 1]},
                        {"name": "mobydick", "evaluate": [0, 1]}]},
        "presses": {"names": ["compresskv", "streaming_llm", "knorm", "snapkv"],
                    "ratios": [0.5, 0.75],
                    "grid": {"compresskv": {"n_sink": [2], "window_size": [4],
                                            "bin_rank": [4]},
                             "streaming_llm": {"n_sink": [2, 4]},
                             "snapkv": {"window_size": [8]}}},
        "tasks": {"kinds": ["niah", "vartrack"], "haystacks": ["gcide"], "lengths": [96],
                  "depths": [0.5], "seeds": [0], "hops": 2, "skip_on_miss": False},
    }
