"""Oracle for the safetensors reader (attn/safetensors.h): files written by
Python with json + numpy only (safetensors_numpy.py, no `safetensors`
package), read by tests/torch/test_safetensors_torch.cpp.

safetensors_mha.safetensors
    the state_dict of the book's MultiHeadAttention(d_in 8, d_out 12,
    context_length 10, dropout 0, 3 heads, qkv_bias) made after
    torch.manual_seed(123): W_query/W_key/W_value weight and bias, out_proj
    weight and bias, and the mask buffer, written in reverse name order with
    json.dumps's spaced separators and metadata.
safetensors_dtypes.safetensors
    F32 (special values: +-0, +-inf, NaN, subnormals, the extremes), BF16 (torch's
    float32 -> bfloat16 cast), I64 (the extremes); shapes 0-d, empty, 1-d, 3-d;
    written with an indented header.
safetensors.json
    x (2, 5, 8) and y = model(x) in eval mode, every parameter's bits, and every
    tensor of the dtype file as bits (int64 as integers), and the float32
    values the BF16 tensor was cast from.
"""
import pathlib

import torch

import book_modules as bm
import safetensors_numpy as stn
from oracle_util import tensor_bits_json, write_json


def generate_gpt(out):
    """The book's GPTModel (safetensors_numpy.GPT_CONFIG, seed 123) as
    safetensors_gpt.safetensors, and its eval-mode logits for fixed ids."""
    import book_gpt
    torch.manual_seed(123)
    model = book_gpt.GPTModel(stn.GPT_CONFIG)
    stn.write(out / "safetensors_gpt.safetensors",
              [(name, stn.torch_to_numpy(t)) for name, t in model.state_dict().items()],
              metadata={"format": "pt", "source": "oracle_safetensors.py"})
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7], [0, 36, 1, 2, 33, 4, 12, 6, 21, 9]])
    model.eval()
    with torch.no_grad():
        logits = model(ids)
    return {"config": stn.GPT_CONFIG, "ids": ids.tolist(), "logits": tensor_bits_json(logits)}


def generate(out_dir):
    out = pathlib.Path(out_dir)

    torch.manual_seed(123)
    model = bm.MultiHeadAttention(8, 12, 10, 0.0, 3, qkv_bias=True)
    state = model.state_dict()
    named = [(name, stn.torch_to_numpy(t)) for name, t in sorted(state.items(), reverse=True)]
    stn.write(out / "safetensors_mha.safetensors", named,
              metadata={"format": "pt", "source": "oracle_safetensors.py"})
    x = torch.linspace(-2.0, 2.0, 80).reshape(2, 5, 8) * torch.linspace(0.5, 1.5, 8)
    model.eval()
    with torch.no_grad():
        y = model(x)

    f32 = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-40,
                        3.4028235e38, -1.1754944e-38, 1.0, -2.5, 0.1], dtype=torch.float32)
    bf16_source = (torch.linspace(-3.0, 3.0, 24) ** 3).reshape(2, 3, 4)
    bf16 = bf16_source.to(torch.bfloat16)
    i64 = torch.tensor([-(2 ** 63), 2 ** 63 - 1, 0, -1, 1, 123456789012345], dtype=torch.int64)
    dtypes = [
        ("f32 special", f32.reshape(3, 4)),
        ("f32 scalar", torch.tensor(2.5, dtype=torch.float32)),
        ("f32 empty", torch.zeros(0, 3, dtype=torch.float32)),
        ("bf16 cube", bf16),
        ("bf16 scalar", torch.tensor(-1.5).to(torch.bfloat16)),
        ("i64 extremes", i64),
        ("i64 empty", torch.zeros(2, 0, dtype=torch.int64)),
        ("i64 scalar", torch.tensor(-7, dtype=torch.int64)),
    ]
    stn.write(out / "safetensors_dtypes.safetensors", [(n, stn.torch_to_numpy(t)) for n, t in dtypes],
              metadata={"what": "every dtype attn reads"}, indent=1)

    expected = {}
    for name, t in dtypes:
        dtype, array = stn.torch_to_numpy(t)
        expected[name] = {"dtype": dtype, "shape": list(t.shape), "bits": stn.bits_of(array)}
    expected["bf16 cube"]["from_f32"] = tensor_bits_json(bf16_source)
    write_json(out / "safetensors.json", {
        "mha": {"x": tensor_bits_json(x), "y": tensor_bits_json(y),
                "state_dict": {name: tensor_bits_json(t) for name, t in state.items()},
                "metadata": {"format": "pt", "source": "oracle_safetensors.py"}},
        "dtypes": expected,
        "gpt": generate_gpt(out),
    })
