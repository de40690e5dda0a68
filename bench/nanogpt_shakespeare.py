#!/usr/bin/env python3
"""nanoGPT's shakespeare_char training step, PyTorch's SDPA against attn's
(attn.sdpa_patched(): nanoGPT's model.py is used unmodified), in one run.

    git clone https://github.com/karpathy/nanoGPT /tmp/nanoGPT    # not part of attn
    /tmp/attn-venv/bin/python bench/nanogpt_shakespeare.py --nanogpt /tmp/nanoGPT \\
        [--batch 64] [--iters 10] [--modes eager compile] [--dtypes float32 bfloat16]

The model is config/train_shakespeare_char.py's (6 layers, 6 heads, n_embd
384, block 256, dropout 0.2, no bias; AdamW lr 1e-3, betas (0.9, 0.99),
weight decay 0.1), the data the characters of data/tinyshakespeare.txt
(nanoGPT's data/shakespeare_char/input.txt), 90% for training. For each mode
(eager, torch.compile) and dtype (float32; bfloat16 under
torch.autocast("cpu"), weights fp32) it times --iters training iterations
(forward, backward, optimizer step; after 2 warm-up iterations, median) with
PyTorch's SDPA and with attn's, alternating iteration by iteration. First it
checks that both give the same loss and gradients on one batch with dropout 0
(fp32, eager). Prints a Markdown table: ms per iteration and attn's speed-up.
"""

import argparse
import copy
import os
import statistics
import sys
import time

import torch

import attn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nanogpt", required=True, help="a checkout of karpathy/nanoGPT")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--modes", nargs="+", default=["eager", "compile"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = ap.parse_args()
    sys.path.insert(0, args.nanogpt)
    from model import GPT, GPTConfig  # nanoGPT's model.py, unmodified

    text = open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text[: int(0.9 * len(text))]], dtype=torch.int64)
    block = 256
    gen = torch.Generator().manual_seed(0)

    def batch():
        ix = torch.randint(len(data) - block, (args.batch,), generator=gen)
        x = torch.stack([data[i:i + block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
        return x, y

    def make(dropout):
        torch.manual_seed(1337)
        cfg = GPTConfig(block_size=block, vocab_size=len(chars), n_layer=6, n_head=6,
                        n_embd=384, dropout=dropout, bias=False)
        return GPT(cfg)

    print(f"PyTorch {torch.__version__}, attn {attn.__version__} (kernel {attn.kernel_target()}), "
          f"{torch.get_num_threads()} threads, batch {args.batch} x {block}")

    # Same loss and gradients with dropout 0.
    x, y = batch()
    ref = make(0.0)
    results = []
    for patched in (False, True):
        m = copy.deepcopy(ref)
        ctx = attn.sdpa_patched() if patched else _null()
        with ctx:
            _, loss = m(x, y)
            loss.backward()
        results.append((loss.item(), [p.grad for p in m.parameters()]))
    dg = max((a - b).abs().max().item() for a, b in zip(results[0][1], results[1][1]))
    print(f"dropout 0, fp32: loss {results[0][0]:.6f} (PyTorch) vs {results[1][0]:.6f} (attn), "
          f"largest gradient |diff| {dg:.1e}")

    print("| mode | dtype | PyTorch SDPA ms/iter | attn ms/iter | speed-up |")
    print("|---|---|---|---|---|")
    for mode in args.modes:
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            runs = {}
            for name in ("torch", "attn"):
                model = make(0.2)
                model.train()
                opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
                fwd = torch.compile(model) if mode == "compile" else model
                runs[name] = (fwd, opt)

            def step(name):
                fwd, opt = runs[name]
                xb, yb = batch()
                ctx = attn.sdpa_patched() if name == "attn" else _null()
                t0 = time.perf_counter()
                with ctx, torch.autocast("cpu", dtype=torch.bfloat16,
                                         enabled=dtype == torch.bfloat16):
                    _, loss = fwd(xb, yb)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return (time.perf_counter() - t0) * 1e3

            times = {"torch": [], "attn": []}
            for _ in range(2):
                for name in times:
                    step(name)
            for _ in range(args.iters):
                for name in times:
                    times[name].append(step(name))
            t, a = statistics.median(times["torch"]), statistics.median(times["attn"])
            print(f"| {mode} | {dtype_name} | {t:.0f} | {a:.0f} | {t / a:.2f}x |", flush=True)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
