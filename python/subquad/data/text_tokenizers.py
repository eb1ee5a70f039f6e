"""Tokenisers for the language models: bytes (256 symbols, nothing to train) and a small
byte-level BPE trained on the training text with Hugging Face's `tokenizers`."""

import json
from typing import List

import numpy as np

from .._optional import require


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocab_size 256, lossless for any text."""

    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        """int64 [len(text.encode())]."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"type": "byte"})


class BpeTokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenisation) with `vocab_size` symbols, trained
    with `tokenizers` on the given texts. Training is deterministic for a given text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def train(cls, texts: List[str], vocab_size: int = 2048) -> "BpeTokenizer":
        require("the BPE tokenizer of subquad.data", "data", ["tokenizers"])
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if vocab_size < 257:
            raise ValueError(f"vocab_size: expected >= 257 (the 256 bytes and merges), "
                             f"got {vocab_size}")
        # A merge joins two adjacent tokens of the text, so the text's bytes bound the
        # merges; beyond that `tokenizers` only allocates (a vocabulary of 10^9 aborts it).
        most = 256 + sum(len(text.encode("utf-8")) for text in texts)
        if vocab_size > most:
            raise ValueError(f"vocab_size: expected at most {most} for BPE on this training "
                             f"text (256 bytes + one merge per byte of it), got {vocab_size}")
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer)

    @classmethod
    def from_json(cls, text: str) -> "BpeTokenizer":
        require("the BPE tokenizer of subquad.data", "data", ["tokenizers"])
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(text))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int64)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def to_json(self) -> str:
        return self.tokenizer.to_str()


def make_tokenizer(kind: str, train_text: str, vocab_size: int = 2048):
    """"byte" -> ByteTokenizer; "bpe" -> BpeTokenizer trained on `train_text`."""
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return BpeTokenizer.train([train_text], vocab_size)
    raise ValueError(f"tokenizer: expected 'byte' or 'bpe', got {kind!r}")
