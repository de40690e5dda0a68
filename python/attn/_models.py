"""attn.Tokenizer.from_file and attn.DecoderLM: today's open models (Llama 3,
Qwen2/3, Gemma 2/3) from their Hugging Face files (docs/open-models.md), with
the same results as the CLI."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import torch

from . import _attn


class HfTokenizer:
    """A Hugging Face tokenizer.json (Llama 3's and Qwen's byte-level BPE,
    Gemma's SentencePiece-style BPE), the ids Hugging Face tokenizers gives:

        tok = attn.Tokenizer.from_file("Qwen3-0.6B/tokenizer.json")   # or the directory
        ids = tok.encode("Hello, world")          # the post-processor's specials added
        tok.decode(ids, skip_special_tokens=True)
    """

    def __init__(self, impl):
        self._impl = impl

    @classmethod
    def from_file(cls, path: str) -> "HfTokenizer":
        path = str(path)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        return cls(_attn.HfTokenizer.from_file(path))

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        return self._impl.encode(text, add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._impl.decode([int(i) for i in ids], skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self._impl.token_to_id(token)

    def id_to_token(self, id: int) -> str:
        return self._impl.id_to_token(int(id))

    @property
    def vocab_size(self) -> int:
        return self._impl.vocab_size


class DecoderLM:
    """A Llama 3 / Qwen2 / Qwen3 / Gemma 2 / Gemma 3 directory, as transformers computes it:

        model = attn.DecoderLM.from_pretrained("Qwen3-0.6B", dtype="bfloat16")
        logits = model.logits(torch.tensor([[1, 2, 3]]))     # (1, 3, V) float32
        ids = model.generate([1, 2, 3], max_new_tokens=20)   # greedy unless temperature > 0
    """

    def __init__(self, impl):
        self._impl = impl

    @classmethod
    def from_pretrained(cls, path: str, dtype: str = "float32", mmap: bool = False) -> "DecoderLM":
        return cls(_attn.DecoderLM(str(path), dtype, mmap))

    def logits(self, ids) -> torch.Tensor:
        ids = torch.as_tensor(ids, dtype=torch.int64)
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        data, shape = self._impl.logits(ids.reshape(-1).tolist(), ids.shape[0])
        return torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(shape)

    def generate(self, ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 123) -> List[int]:
        return self._impl.generate([int(i) for i in ids], max_new_tokens, temperature, top_k, top_p,
                                   seed)

    @property
    def model_type(self) -> str:
        return self._impl.model_type

    @property
    def vocab_size(self) -> int:
        return self._impl.vocab_size

    @property
    def eos_token_ids(self) -> List[int]:
        return self._impl.eos_token_ids
