"""attn.Tokenizer.from_file and attn.DecoderLM: today's open models (Llama 3,
Qwen2/3, Gemma 2/3) from their Hugging Face files (docs/open-models.md), with
the same results as the CLI."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Union


from . import _attn


def _continue_field(continue_final_message: Union[bool, str]) -> str:
    """transformers' continue_final_message (False, True or a field's name) as
    attn's: "" (off), "content" or the field."""
    if isinstance(continue_final_message, str):
        if not continue_final_message:
            raise ValueError("continue_final_message must be True, False or a field's name")
        return continue_final_message
    return "content" if continue_final_message else ""


class ChatTemplate:
    """A chat template (docs/open-models.md, "Chat"): a conversation rendered as
    transformers' apply_chat_template(..., tokenize=False) renders it, by attn's
    Jinja interpreter:

        chat = attn.ChatTemplate.from_model_dir("Qwen3-0.6B")
        chat.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                    enable_thinking=False)
    """

    def __init__(self, source: str, special_tokens: Optional[Dict[str, str]] = None,
                 _impl=None):
        self._impl = _impl if _impl is not None else _attn.ChatTemplate(
            source, dict(special_tokens or {}), "chat template")

    @classmethod
    def from_model_dir(cls, path: str) -> Optional["ChatTemplate"]:
        """The template of a model directory (chat_template.jinja, tokenizer_config.json's
        chat_template, chat_template.json) with its special tokens, or None."""
        impl = _attn.ChatTemplate.from_model_dir(str(path))
        return None if impl is None else cls("", _impl=impl)

    @classmethod
    def from_file(cls, path: str, model_dir: str = "") -> "ChatTemplate":
        """The template of a .jinja file (or a .json file's "chat_template"), with
        model_dir's special tokens."""
        return cls("", _impl=_attn.ChatTemplate.from_file(str(path), str(model_dir)))

    def render(self, conversation: Sequence[Dict[str, Any]], tools: Optional[List[Any]] = None,
               documents: Optional[List[Any]] = None, add_generation_prompt: bool = False,
               continue_final_message: Union[bool, str] = False, **kwargs) -> str:
        """The text of the conversation; kwargs are more template variables.
        continue_final_message (transformers'): True, or the name of the last
        message's field to continue ("reasoning_content", ...): the text ends
        inside it, with no end of turn after it (a prefilled reply)."""
        extra = dict(kwargs)
        if tools is not None:
            extra["tools"] = tools
        if documents is not None:
            extra["documents"] = documents
        return self._impl.apply_json(json.dumps(list(conversation), ensure_ascii=False),
                                     bool(add_generation_prompt),
                                     json.dumps(extra, ensure_ascii=False) if extra else "",
                                     _continue_field(continue_final_message))

    @property
    def special_tokens(self) -> Dict[str, str]:
        return dict(self._impl.special_tokens)

    @property
    def source(self) -> str:
        return self._impl.source


class HfTokenizer:
    """A Hugging Face tokenizer.json (Llama 3's and Qwen's byte-level BPE,
    Gemma's SentencePiece-style BPE), the ids Hugging Face tokenizers gives:

        tok = attn.Tokenizer.from_file("Qwen3-0.6B/tokenizer.json")   # or the directory
        ids = tok.encode("Hello, world")          # the post-processor's specials added
        tok.decode(ids, skip_special_tokens=True)
    """

    def __init__(self, impl, model_dir: Optional[str] = None):
        self._impl = impl
        self._model_dir = model_dir
        self._chat_template: Optional[ChatTemplate] = None

    @classmethod
    def from_file(cls, path: str) -> "HfTokenizer":
        path = str(path)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        tok = _attn.HfTokenizer.from_file(path)
        return cls(tok, os.path.dirname(os.path.abspath(path)))

    @property
    def chat_template(self) -> Optional[ChatTemplate]:
        """The chat template of the directory the tokenizer came from (None when it
        has none), read when first asked for: a template attn cannot parse fails
        here, not when the tokenizer is loaded."""
        if self._chat_template is None and self._model_dir is not None:
            self._chat_template = ChatTemplate.from_model_dir(self._model_dir)
            if self._chat_template is None:
                self._model_dir = None
        return self._chat_template

    @chat_template.setter
    def chat_template(self, template: Optional[ChatTemplate]) -> None:
        self._chat_template = template
        self._model_dir = None

    def apply_chat_template(self, conversation: Sequence[Dict[str, Any]],
                            tools: Optional[List[Any]] = None,
                            documents: Optional[List[Any]] = None,
                            chat_template: Optional[str] = None,
                            add_generation_prompt: bool = False, tokenize: bool = True,
                            return_dict: bool = True,
                            continue_final_message: Union[bool, str] = False,
                            **kwargs) -> Union[str, List[int], Dict[str, List[int]]]:
        """transformers' PreTrainedTokenizer.apply_chat_template (same names and
        defaults): the conversation through the directory's chat template (or the
        template source `chat_template`), kwargs as more template variables
        (enable_thinking=False, date_string=...). tokenize=False: the text;
        tokenize=True: its ids without the post-processor's specials (the template
        writes the BOS), as {"input_ids", "attention_mask"} (return_dict=True, as
        transformers 5 returns) or a list of ids."""
        template = self.chat_template
        if chat_template is not None:
            specials = template.special_tokens if template is not None else {}
            template = ChatTemplate(chat_template, specials)
        if template is None:
            raise ValueError(
                "Cannot use chat template functions because the tokenizer's directory has no "
                "chat template (tokenizer_config.json's chat_template, chat_template.jinja or "
                "chat_template.json) and no chat_template argument was passed")
        text = template.render(conversation, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt,
                               continue_final_message=continue_final_message, **kwargs)
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        if return_dict:
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        return ids

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
        from ._torch import require
        torch = require("attn.DecoderLM.logits")
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
