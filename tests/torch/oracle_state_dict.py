"""state_dict() and named_buffers() of the chapter's modules (book_modules.py),
from PyTorch 1.13: the keys in order, each tensor's shape, and the buffers'
values, for small configurations of every module attn mirrors.

Writes state_dict.json: {"modules": [{"name", "args", "state_dict": [[key,
shape], ...], "buffers": [[name, tensor_json], ...]}]}; "args" are the
constructor's keyword arguments, which the C++ test passes to attn's options.
"""
import torch

import book_modules as bm
from oracle_util import tensor_json, write_json

CASES = [
    ("SelfAttention_v1", bm.SelfAttention_v1, {"d_in": 3, "d_out": 2}),
    ("SelfAttention_v2", bm.SelfAttention_v2, {"d_in": 3, "d_out": 2, "qkv_bias": True}),
    ("CausalAttention", bm.CausalAttention,
     {"d_in": 3, "d_out": 2, "context_length": 5, "dropout": 0.0, "qkv_bias": True}),
    ("MultiHeadAttentionWrapper", bm.MultiHeadAttentionWrapper,
     {"d_in": 3, "d_out": 2, "context_length": 4, "dropout": 0.0, "num_heads": 2}),
    ("MultiHeadAttention", bm.MultiHeadAttention,
     {"d_in": 3, "d_out": 4, "context_length": 6, "dropout": 0.0, "num_heads": 2}),
    ("Head", bm.Head, {"n_embd": 4, "head_size": 3, "block_size": 5, "dropout": 0.0}),
    ("EncoderHead", bm.Head, {"n_embd": 4, "head_size": 3, "block_size": 5, "dropout": 0.0, "causal": False}),
    ("MultiHead", bm.MultiHead,
     {"n_embd": 4, "num_heads": 2, "head_size": 3, "block_size": 3, "dropout": 0.0}),
]


def generate(out_dir):
    modules = []
    for name, cls, args in CASES:
        torch.manual_seed(0)
        m = cls(**args)
        modules.append({
            "name": name, "args": args,
            "state_dict": [[k, list(v.shape)] for k, v in m.state_dict().items()],
            "buffers": [[k, tensor_json(v)] for k, v in m.named_buffers()],
        })
    write_json(out_dir / "state_dict.json", {"modules": modules})
