"""Reference values for attn's Tensor (attn/tensor.h): dtype conversions, the
layout of views, and printing of bfloat16 and int64 tensors, from PyTorch 1.13.

Writes tensor.json:
  "bf16":  {"float_bits": [...], "bf16_bits": [...]}  float32 -> bfloat16 by
           x.to(torch.bfloat16), as bit patterns (ties, NaN, inf, subnormals);
  "views": [{"name", "shape", "ops", "result": {"shape", "stride",
           "storage_offset", "is_contiguous", "shares_storage", "values"}}]
           for a contiguous arange(numel(shape)).reshape(shape) put through
           the ops in order; "shares_storage" says whether the result still
           views the input's storage (a view) or was copied;
  "print": [{"name", "dtype", "tensor" (float32 bits or int64 values), "str"}]
           str(t) of bfloat16 and int64 tensors.
"""
import math

import torch

from oracle_util import tensor_bits_json, write_json


def float_bits(values):
    t = torch.tensor(values, dtype=torch.float32)
    return [b & 0xFFFFFFFF for b in t.view(torch.int32).tolist()]


def bf16_cases(g):
    specials = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 3.4028234663852886e38,
                -3.4028234663852886e38, 1e-40, -1e-40, 1.17549435e-38, 1.401298464324817e-45,
                65504.0, 1.0 / 3.0, 0.1, 0.2, 0.3, 1e8, 123456.789]
    bits = float_bits(specials)
    # Exact ties and their neighbours: low 16 bits 0x8000 with an even and an odd
    # high half, and one ulp either side of the tie.
    for high in (0x3F80, 0x3F81, 0x4049, 0x404A, 0xC2F6, 0xC2F7, 0x7F7F, 0x0001, 0x0000):
        for low in (0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x0000):
            bits.append((high << 16) | low)
    # Quiet and signalling NaNs with payloads.
    bits += [0x7FC00001, 0x7F800001, 0xFFC12345, 0x7FFFFFFF]
    # Random values over many scales.
    for scale in (1e-30, 1e-3, 1.0, 1e3, 1e30):
        x = torch.randn(200, generator=g) * scale
        bits += [b & 0xFFFFFFFF for b in x.view(torch.int32).tolist()]
    x = torch.tensor(bits, dtype=torch.int64).to(torch.int32)
    f = x.view(torch.float32)
    bf = f.to(torch.bfloat16).view(torch.int16).tolist()
    return {"float_bits": bits, "bf16_bits": [b & 0xFFFF for b in bf]}


VIEW_CASES = [
    # name, input shape, ops
    ("transpose", [2, 3], [["transpose", 0, 1]]),
    ("transpose_flatten_copies", [2, 3], [["transpose", 0, 1], ["reshape", [-1]]]),
    ("mha_split_heads", [2, 5, 12], [["view", [2, 5, 3, 4]], ["transpose", 1, 2]]),
    ("mha_merge_heads", [2, 3, 5, 4], [["transpose", 1, 2], ["reshape", [2, 5, 12]]]),
    ("mha_split_merge", [2, 5, 12], [["view", [2, 5, 3, 4]], ["transpose", 1, 2],
                                     ["transpose", 1, 2], ["reshape", [2, 5, 12]]]),
    ("keys_T", [2, 6, 4], [["transpose", -2, -1]]),
    ("keys_T_merge_batch", [2, 3, 6, 4], [["transpose", -2, -1], ["reshape", [6, 4, 6]]]),
    ("permute", [2, 3, 4], [["permute", [2, 0, 1]]]),
    ("permute_reshape_copies", [2, 3, 4], [["permute", [2, 0, 1]], ["reshape", [4, 6]]]),
    ("permute_then_split_view", [2, 3, 4], [["permute", [2, 0, 1]], ["reshape", [2, 2, 2, 3]]]),
    ("slice_rows", [6, 4], [["slice", 0, 1, 4]]),
    ("slice_cols", [6, 4], [["slice", 1, 1, 3]]),
    ("slice_cols_flatten_copies", [6, 4], [["slice", 1, 1, 3], ["reshape", [-1]]]),
    ("slice_rows_flatten_views", [6, 4], [["slice", 0, 2, 5], ["reshape", [-1]]]),
    ("slice_clamped", [6, 4], [["slice", 0, -2, 100]]),
    ("slice_empty", [6, 4], [["slice", 0, 4, 2]]),
    ("select", [2, 3, 4], [["select", 1, 2]]),
    ("select_negative", [2, 3, 4], [["select", -1, -1]]),
    ("select_then_transpose", [2, 3, 4], [["select", 0, 1], ["transpose", 0, 1]]),
    ("unsqueeze_front", [3, 4], [["unsqueeze", 0]]),
    ("unsqueeze_back", [3, 4], [["unsqueeze", -1]]),
    ("unsqueeze_of_transpose", [3, 4], [["transpose", 0, 1], ["unsqueeze", 1]]),
    ("squeeze", [3, 1, 4], [["squeeze", 1]]),
    ("squeeze_noop", [3, 2, 4], [["squeeze", 1]]),
    ("contiguous_of_transpose", [3, 4], [["transpose", 0, 1], ["contiguous"]]),
    ("contiguous_of_contiguous", [3, 4], [["contiguous"]]),
    ("view_size_one_dims", [1, 6, 1], [["transpose", 0, 2], ["view", [6]]]),
    ("reshape_infer", [4, 6], [["reshape", [3, -1, 2]]]),
]


def apply(x, ops):
    for op in ops:
        name, args = op[0], op[1:]
        if name == "transpose":
            x = x.transpose(args[0], args[1])
        elif name == "reshape":
            x = x.reshape(args[0])
        elif name == "view":
            x = x.view(args[0])
        elif name == "permute":
            x = x.permute(*args[0])
        elif name == "slice":
            dim, start, end = args
            index = [slice(None)] * x.dim()
            index[dim] = slice(start, end)
            x = x[tuple(index)]
        elif name == "select":
            x = x.select(args[0], args[1])
        elif name == "unsqueeze":
            x = x.unsqueeze(args[0])
        elif name == "squeeze":
            x = x.squeeze(args[0])
        elif name == "contiguous":
            x = x.contiguous()
        else:
            raise ValueError(name)
    return x


def view_cases():
    out = []
    for name, shape, ops in VIEW_CASES:
        n = 1
        for s in shape:
            n *= s
        x = torch.arange(n, dtype=torch.float32).reshape(shape)
        y = apply(x, ops)
        out.append({"name": name, "shape": shape, "ops": ops, "result": {
            "shape": list(y.shape), "stride": list(y.stride()), "storage_offset": y.storage_offset(),
            "is_contiguous": y.is_contiguous(),
            "shares_storage": y.storage().data_ptr() == x.storage().data_ptr(),
            "values": [float(v) for v in y.reshape(-1).tolist()]}})
    return out


def print_cases(g):
    cases = []

    def bf16(name, t):
        t = t.to(torch.float32)
        cases.append({"name": name, "dtype": "bfloat16", "tensor": tensor_bits_json(t),
                      "str": str(t.to(torch.bfloat16))})

    def int64(name, t):
        cases.append({"name": name, "dtype": "int64", "tensor": {"shape": list(t.shape),
                      "values": t.reshape(-1).tolist()}, "str": str(t)})

    bf16("bf16_randn_6x3", torch.randn(6, 3, generator=g))
    bf16("bf16_rand_8", torch.rand(8, generator=g))
    bf16("bf16_scaled_1e4", torch.randn(3, 4, generator=g) * 1e4)
    bf16("bf16_small_sci", torch.rand(5, generator=g) * 1e-5)
    bf16("bf16_integers", torch.tensor([[1.0, 2.0, -3.0], [256.0, 257.0, 0.0]]))
    bf16("bf16_inf_nan", torch.tensor([1.5, math.inf, -math.inf, math.nan, -0.0]))
    bf16("bf16_summarised", torch.randn(40, 40, generator=g))
    bf16("bf16_scalar", torch.tensor(3.14159))
    bf16("bf16_empty_2d", torch.zeros(0, 3))
    bf16("bf16_empty_1d", torch.zeros(0))
    bf16("bf16_wide_row", torch.randn(30, generator=g))
    int64("int64_token_ids", torch.tensor([[40, 367, 2885, 1464], [1807, 3619, 402, 271]]))
    int64("int64_negative", torch.tensor([-5, 17, 0, -123456789012]))
    int64("int64_arange_2000", torch.arange(2000))
    int64("int64_scalar", torch.tensor(7))
    int64("int64_empty", torch.zeros(0, dtype=torch.int64))
    int64("int64_empty_2d", torch.zeros(2, 0, dtype=torch.int64))
    int64("int64_wide_row", torch.arange(50257 - 40, 50257))
    return cases


def generate(out_dir):
    g = torch.Generator().manual_seed(2024)
    write_json(out_dir / "tensor.json", {"bf16": bf16_cases(g), "views": view_cases(),
                                         "print": print_cases(g)})
