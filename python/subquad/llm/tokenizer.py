"""The GPT-2 byte-level BPE tokenizer stored in a GGUF's metadata, built with `tokenizers`,
and the ChatML chat format of the model's template.

Pre-tokenizer "smollm" (llama.cpp's name): every digit is its own piece, then GPT-2's
byte-level split (no prefix space). Control tokens (token_type 3, e.g. <|im_start|>) are
special tokens: matched whole in text, kept when decoding unless skip_special is set.
"""

import numbers
from typing import Dict, List, Optional, Sequence

from .gguf_file import GgufError, chat_system_prompt

__all__ = ["GgufTokenizer"]

_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
_PRE_TOKENIZERS = ("smollm",)


class GgufTokenizer:
    """tokenize(text) -> ids, detokenize(ids) -> text, chat(messages) -> prompt text."""

    def __init__(self, metadata: Dict[str, object], path: str = "<gguf>"):
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        model = metadata.get("tokenizer.ggml.model")
        pre = metadata.get("tokenizer.ggml.pre")
        if model != "gpt2":
            raise GgufError(f"{path}: tokenizer.ggml.model must be 'gpt2', got {model!r}")
        if pre not in _PRE_TOKENIZERS:
            raise GgufError(f"{path}: tokenizer.ggml.pre must be one of {_PRE_TOKENIZERS}, "
                            f"got {pre!r}")
        tokens = metadata.get("tokenizer.ggml.tokens")
        merges = metadata.get("tokenizer.ggml.merges")
        types = metadata.get("tokenizer.ggml.token_type")
        if not tokens or merges is None or types is None or len(types) != len(tokens):
            raise GgufError(f"{path}: tokenizer tokens, merges and token types are required "
                            f"(token types one per token)")
        vocab = {token: index for index, token in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise GgufError(f"{path}: tokenizer.ggml.tokens has duplicates")
        pairs = []
        for merge in merges:
            left, space, right = merge.partition(" ")
            if not space or left + right not in vocab:
                raise GgufError(f"{path}: merge {merge!r} does not make a vocabulary token")
            pairs.append((left, right))
        tokenizer = Tokenizer(models.BPE(vocab, pairs))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tokenizer.decoder = decoders.ByteLevel()
        self.special_ids = [index for index, kind in enumerate(types) if kind == _CONTROL]
        tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                      for i in self.special_ids])
        self._tokenizer = tokenizer
        self.vocab_size = len(tokens)
        self.bos_id = metadata.get("tokenizer.ggml.bos_token_id")
        self.eos_id = metadata.get("tokenizer.ggml.eos_token_id")
        for key, value in (("bos_token_id", self.bos_id), ("eos_token_id", self.eos_id)):
            if value is not None and not (isinstance(value, numbers.Integral)
                                          and not isinstance(value, bool)
                                          and 0 <= value < len(tokens)):
                raise GgufError(f"{path}: tokenizer.ggml.{key} {value!r} is not a token id "
                                f"(0 .. {len(tokens) - 1})")
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
        self.system_prompt = chat_system_prompt(metadata.get("tokenizer.chat_template"))
        self.im_end_id = vocab.get("<|im_end|>")

    def tokenize(self, text: str, *, add_bos: Optional[bool] = None) -> List[int]:
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:  # lone surrogates: undecodable bytes of argv
            raise ValueError(f"text: not valid Unicode ({error.reason} at character "
                             f"{error.start}): was it decoded from bytes that are not "
                             f"UTF-8?") from None
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [int(self.bos_id)] + ids
        return ids

    def detokenize(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids: expected token ids in [0, {self.vocab_size}), got {bad[:5]}")
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special)

    def chat(self, messages: Sequence[Dict[str, str]], *,
             add_generation_prompt: bool = True) -> str:
        """The prompt text of the model's ChatML template for [{"role", "content"}, ...]:
        the template's default system message first unless one is given."""
        parts = []
        for index, message in enumerate(messages):
            if set(message) != {"role", "content"}:
                raise ValueError(f"messages[{index}]: expected keys role and content, got "
                                 f"{sorted(message)}")
            if index == 0 and message["role"] != "system" and self.system_prompt is not None:
                parts.append(f"<|im_start|>system\n{self.system_prompt}<|im_end|>\n")
            parts.append(f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)
