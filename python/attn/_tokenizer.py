"""attn.Tokenizer: GPT-2's BPE tokenizer (attn/tokenizer.h, docs/tokenizer.md)
with tiktoken's Encoding API, so that code written for tiktoken.get_encoding("gpt2")
runs on it unchanged: the same ids, the same special-token rules."""

from __future__ import annotations

from typing import AbstractSet, Collection, List, Literal, Sequence, Union

from . import _attn

_ENDOFTEXT = "<|endoftext|>"
# encode_parallel pays off above this many bytes (the ids are the same either way).
_PARALLEL_BYTES = 1 << 20


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates: replaced, as tiktoken does.
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


class Tokenizer:
    """GPT-2's byte-level BPE tokenizer, tiktoken-compatible.

    tok = attn.Tokenizer()                       # GPT-2's vocabulary (embedded)
    tok = attn.Tokenizer.from_files("vocab.json", "merges.txt")
    ids = tok.encode("Hello, I am")              # [15496, 11, 314, 716]
    tok.decode(ids)                              # "Hello, I am"

    encode follows tiktoken's rules for "<|endoftext|>": text holding it raises
    ValueError unless it is allowed (allowed_special={"<|endoftext|>"} or "all":
    encoded as the special token 50256) or the check is turned off
    (disallowed_special=(): encoded as ordinary text).
    """

    name = "gpt2"

    def __init__(self, _impl=None):
        self._impl = _attn.Tokenizer.gpt2() if _impl is None else _impl

    @classmethod
    def from_files(cls, vocab_json: str, merges_txt: str) -> "Tokenizer":
        """A vocabulary in Hugging Face's files (vocab.json and merges.txt)."""
        return cls(_attn.Tokenizer.from_files(str(vocab_json), str(merges_txt)))

    @staticmethod
    def from_file(path: str):
        """A Hugging Face tokenizer.json (or a model directory holding one): Llama 3's,
        Qwen's, Gemma's. Returns an attn.HfTokenizer (tokenizers' encode/decode API)."""
        from ._models import HfTokenizer
        return HfTokenizer.from_file(path)

    # ---- properties ----
    @property
    def n_vocab(self) -> int:
        return self._impl.vocab_size

    @property
    def eot_token(self) -> int:
        return self._impl.eot_token

    @property
    def special_tokens_set(self) -> AbstractSet[str]:
        return {_ENDOFTEXT} if self._impl.eot_token >= 0 else set()

    # ---- encoding ----
    def _allow(self, text: str, allowed_special, disallowed_special) -> bool:
        special = self.special_tokens_set
        allowed = special if allowed_special == "all" else set(allowed_special)
        disallowed = (special - allowed if disallowed_special == "all"
                      else set(disallowed_special))
        for token in sorted(disallowed):
            if token in text:
                raise ValueError(
                    f"Encountered text corresponding to disallowed special token {token!r}.\n"
                    f"If you want this text to be encoded as a special token, pass it to "
                    f"`allowed_special`, e.g. `allowed_special={{{token!r}, ...}}`.\n"
                    f"If you want this text to be encoded as normal text, disable the check "
                    f"for this token by passing `disallowed_special=(enc.special_tokens_set - "
                    f"{{{token!r}}})`.\n"
                    f"To disable this check for all special tokens, pass "
                    f"`disallowed_special=()`.\n")
        return _ENDOFTEXT in allowed

    def _encode(self, text: str, allow_special: bool) -> List[int]:
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer.encode: text must be str, got {type(text).__name__}")
        data = _utf8(text)
        from ._threads import get_num_threads  # the same thread rule as the kernels

        threads = get_num_threads() if len(data) >= _PARALLEL_BYTES else 1
        return self._impl.encode(data, allow_special, threads)

    def encode(self, text: str, *,
               allowed_special: Union[Literal["all"], AbstractSet[str]] = frozenset(),
               disallowed_special: Union[Literal["all"], Collection[str]] = "all") -> List[int]:
        """The ids of text, with tiktoken's special-token rules (see the class)."""
        return self._encode(text, self._allow(text, allowed_special, disallowed_special))

    def encode_ordinary(self, text: str) -> List[int]:
        """The ids of text, every special-token string encoded as ordinary text."""
        return self._encode(text, False)

    def encode_batch(self, text: Sequence[str], *, num_threads: int = 8,
                     allowed_special: Union[Literal["all"], AbstractSet[str]] = frozenset(),
                     disallowed_special: Union[Literal["all"], Collection[str]] = "all"
                     ) -> List[List[int]]:
        """encode of each text, the texts encoded on up to num_threads threads at
        once (as tiktoken's); the ids are encode's, in the texts' order."""
        flags = [self._allow(t, allowed_special, disallowed_special) for t in self._texts(text)]
        return self._batch(text, flags, num_threads)

    def encode_ordinary_batch(self, text: Sequence[str], *, num_threads: int = 8
                              ) -> List[List[int]]:
        """encode_ordinary of each text, on up to num_threads threads at once."""
        return self._batch(text, [False] * len(self._texts(text)), num_threads)

    @staticmethod
    def _texts(text: Sequence[str]) -> Sequence[str]:
        if isinstance(text, str):
            raise TypeError("Tokenizer.encode_batch: text must be a sequence of str, got one str")
        for t in text:
            if not isinstance(t, str):
                raise TypeError(f"Tokenizer.encode_batch: text must hold str, got {type(t).__name__}")
        return text

    def _batch(self, text: Sequence[str], flags: List[bool], num_threads: int) -> List[List[int]]:
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"Tokenizer.encode_batch: num_threads must be an int >= 1, got {num_threads!r}")
        return self._impl.encode_batch([_utf8(t) for t in text], flags, num_threads)

    def encode_to_numpy(self, text: str, *,
                        allowed_special: Union[Literal["all"], AbstractSet[str]] = frozenset(),
                        disallowed_special: Union[Literal["all"], Collection[str]] = "all"):
        """encode's ids as a numpy uint32 array (tiktoken's type)."""
        import numpy as np

        return np.asarray(self.encode(text, allowed_special=allowed_special,
                                      disallowed_special=disallowed_special), dtype=np.uint32)

    # ---- decoding ----
    def decode_bytes(self, tokens: Sequence[int]) -> bytes:
        """The bytes of the tokens, joined. IndexError for an id outside the vocabulary."""
        return self._impl.decode_bytes([int(t) for t in tokens])

    def decode(self, tokens: Sequence[int], errors: str = "replace") -> str:
        """The text of the tokens (bytes that are not UTF-8 decoded with `errors`)."""
        return self.decode_bytes(tokens).decode("utf-8", errors=errors)

    def decode_single_token_bytes(self, token: int) -> bytes:
        """The bytes of one token (ValueError for an id outside the vocabulary)."""
        return self._impl.token_bytes(int(token))

    def decode_batch(self, batch: Sequence[Sequence[int]], *, errors: str = "replace",
                     num_threads: int = 8) -> List[str]:
        """decode of each list of ids (num_threads accepted as tiktoken's)."""
        return [self.decode(tokens, errors=errors) for tokens in batch]

    def __repr__(self) -> str:
        return f"<attn.Tokenizer {self.name!r} ({self.n_vocab} tokens)>"


def get_encoding(name: str = "gpt2") -> Tokenizer:
    """tiktoken.get_encoding's counterpart: only "gpt2"."""
    if name != "gpt2":
        raise ValueError(f"attn.get_encoding: only 'gpt2' is available, got {name!r}")
    return Tokenizer()


__all__ = ["Tokenizer", "get_encoding"]
