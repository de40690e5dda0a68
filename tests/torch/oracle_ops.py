"""Reference values for attn/ops.h: every op on seeded random inputs, including
broadcasting, batched matmul and softmax over each dim.

Writes ops.json: {"cases": [{"op", "args", "inputs", "out", "exact"}]}. Tensors
are stored as float32 bit patterns (tensor_bits_json) so -inf and NaN survive.
"exact" marks ops whose result must match bit for bit (no rounding choices:
+, -, *, /, copies, masks); the others are compared with a tolerance in
tests/torch/test_ops_torch.cpp.
"""
import math

import torch

from oracle_util import tensor_bits_json, write_json


def generate(out_dir):
    g = torch.Generator().manual_seed(20261122)

    def randn(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    def rand(*shape):
        return torch.rand(shape, generator=g, dtype=torch.float32)

    cases = []

    def add(op, inputs, out, exact, **args):
        cases.append({
            "op": op,
            "args": args,
            "inputs": [tensor_bits_json(t) for t in inputs],
            "out": tensor_bits_json(out if isinstance(out, torch.Tensor) else torch.tensor(out)),
            "exact": exact,
        })

    # ---- element-wise with broadcasting
    pairs = [((2, 3), (2, 3)), ((2, 3), (3,)), ((2, 3), (2, 1)), ((3, 1), (1, 4)), ((2, 1, 3), (4, 1)),
             ((4,), (2, 3, 4)), ((), (5,)), ((2, 6, 6), (6, 6)), ((1,), (3, 3)), ((2, 4, 6, 16), (1, 4, 1, 16)),
             ((17,), (17,)), ((65, 33), (33,))]
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
    for sa, sb in pairs:
        a, b = randn(*sa), randn(*sb)
        for name, fn in binary.items():
            add(name, [a, b], fn(a, b), True)
    for s in [0.5, -3.25, math.sqrt(2.0), 1.0 / 3.0, 1e-3]:
        a = randn(3, 5)
        add("add_scalar", [a], a + s, True, s=s)
        add("sub_scalar", [a], a - s, True, s=s)
        add("mul_scalar", [a], a * s, True, s=s)
        add("div_scalar", [a], a / s, True, s=s)
    a = randn(4, 7)
    add("neg", [a], -a, True)
    add("exp", [a], a.exp(), False)
    p = rand(4, 7) * 10
    add("sqrt", [p], p.sqrt(), False)
    acc, b = randn(2, 3, 4), randn(3, 1)
    add("iadd", [acc, b], acc + b, True)

    # ---- reductions over every dim
    for shape in [(7,), (2, 3, 4), (5, 33)]:
        x = randn(*shape)
        for dim in range(-len(shape), len(shape)):
            for keepdim in (False, True):
                add("sum", [x], x.sum(dim, keepdim=keepdim), False, dim=dim, keepdim=keepdim)
                add("mean", [x], x.mean(dim, keepdim=keepdim), False, dim=dim, keepdim=keepdim)
                add("max", [x], x.max(dim, keepdim=keepdim).values, True, dim=dim, keepdim=keepdim)
        add("sum_all", [x], x.sum(), False)

    # ---- matmul in all its forms
    mm_shapes = [
        ((3,), (3,)),                # dot
        ((4, 3), (3,)),              # matrix @ vector
        ((3,), (3, 5)),              # vector @ matrix
        ((6, 3), (3, 2)),            # the chapter's X W
        ((6, 3), (3, 6)),            # X X^T sized
        ((2, 6, 3), (3, 2)),         # (B, T, d_in) @ (d_in, d_out)
        ((2, 3, 5, 4), (4, 6)),      # (..., m, k) @ (k, n)
        ((2, 6, 3), (2, 3, 2)),      # bmm
        ((2, 4, 6, 16), (2, 4, 16, 6)),  # (B, H, T, hd) @ (B, H, hd, T)
        ((2, 4, 6, 6), (2, 4, 6, 16)),   # weights @ values
        ((2, 1, 5, 3), (4, 3, 2)),   # broadcast batch dims
        ((5, 3), (2, 3, 4)),         # matrix @ batch
        ((2, 4, 3), (3,)),           # batch @ vector
        ((3,), (2, 3, 4)),           # vector @ batch
        ((1, 1), (1, 1)),
        ((17, 33), (33, 65)),
        ((15, 16), (16, 31)),
        ((64, 64), (64, 64)),
        ((3, 63, 65), (65, 17)),
    ]
    for sa, sb in mm_shapes:
        a, b = randn(*sa), randn(*sb)
        add("matmul", [a, b], torch.matmul(a, b), False)
    a, b = randn(17), randn(17)
    add("dot", [a, b], torch.dot(a, b), False)

    # ---- shape ops
    x = randn(2, 3, 4, 5)
    for d0 in range(-4, 4):
        for d1 in range(-4, 4):
            if d0 < d1:
                add("transpose", [x], x.transpose(d0, d1), True, dim0=d0, dim1=d1)
    m = randn(4, 6)
    add("t", [m], m.t(), True)
    for dim, i in [(0, 1), (0, -1), (1, 2), (-1, 4), (2, -3), (3, 0)]:
        add("select", [x], x.select(dim, i), True, dim=dim, i=i)
    for dim, start, end in [(0, 0, 1), (1, 1, 3), (-1, -3, 100), (2, -100, 2), (3, 4, 2), (1, -2, -1)]:
        index = (slice(None),) * (dim % 4) + (slice(start, end),)  # x[..., start:end] on dim
        add("slice", [x], x[index], True, dim=dim, start=start, end=end)
    a, b, c = randn(2, 3, 4), randn(2, 1, 4), randn(2, 5, 4)
    add("cat", [a, b, c], torch.cat([a, b, c], 1), True, dim=1)
    add("cat", [a, a * 2], torch.cat([a, a * 2], 0), True, dim=0)
    d = randn(2, 3, 7)
    add("cat", [a, d], torch.cat([a, d], -1), True, dim=-1)
    for dim in range(-4, 4):
        p, q, r = randn(2, 3, 4), randn(2, 3, 4), randn(2, 3, 4)
        add("stack", [p, q, r], torch.stack([p, q, r], dim), True, dim=dim)
    for dim in range(-4, 4):
        add("unsqueeze", [a], a.unsqueeze(dim), True, dim=dim)
    y = randn(2, 1, 4, 1)
    for dim in range(-4, 4):
        add("squeeze", [y], y.squeeze(dim), True, dim=dim)

    # ---- masks and normalisations
    for shape in [(5, 7), (7, 5), (2, 4, 4)]:
        z = randn(*shape)
        for diagonal in range(-2, 3):
            add("tril", [z], z.tril(diagonal), True, diagonal=diagonal)
            add("triu", [z], z.triu(diagonal), True, diagonal=diagonal)
    scores = randn(2, 6, 6)  # fill values go as text ("-inf"): JSON has no infinity
    causal = torch.triu(torch.ones(6, 6), diagonal=1)
    add("masked_fill", [scores, causal], scores.masked_fill(causal.bool(), -math.inf), True, value="-inf")
    mask = (rand(2, 1, 6) > 0.5).float()
    add("masked_fill", [scores, mask], scores.masked_fill(mask.bool(), 0.5), True, value="0.5")

    x = randn(2, 3, 4)
    for dim in range(-3, 3):
        add("softmax", [x], torch.softmax(x, dim), False, dim=dim)
        add("softmax_naive", [x], x.exp() / x.exp().sum(dim, keepdim=True), False, dim=dim)
    w = randn(2, 4, 6, 6).masked_fill(causal.bool(), -math.inf) / math.sqrt(16)
    add("softmax", [w], torch.softmax(w, -1), False, dim=-1)
    big = randn(3, 17) * 1000
    add("softmax", [big], torch.softmax(big, -1), False, dim=-1)
    add("softmax_naive", [big], big.exp() / big.exp().sum(-1, keepdim=True), False, dim=-1)
    nan_row = torch.tensor([[-math.inf, -math.inf, -math.inf], [1.0, 2.0, 3.0]])
    add("softmax", [nan_row], torch.softmax(nan_row, -1), False, dim=-1)
    for width in (1, 15, 16, 17, 63, 64, 65):
        v = randn(3, width) * 4
        add("softmax", [v], torch.softmax(v, -1), False, dim=-1)
    u = rand(6, 6) + 0.01
    for dim in (0, 1, -1):
        add("normalize_sum", [u], u / u.sum(dim, keepdim=True), False, dim=dim)

    write_json(out_dir / "ops.json", {"torch": torch.__version__, "cases": cases})
