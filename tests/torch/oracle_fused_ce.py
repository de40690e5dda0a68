"""Oracle for the fused output head + cross-entropy (attn/linear_cross_entropy.h,
GPTModel::forward_loss) under PyTorch 1.13: the reference values
tests/torch/test_fused_ce_torch.cpp compares attn's fused loss with.

Writes fused_ce.json: for a small book GPTModel (tests/torch/book_gpt.py) after
torch.manual_seed(123), train mode, drop_rate 0, one batch of B x T = 3 x 13
tokens (39 rows: with attn's chunks of 8 rows the last chunk has 7), the loss
F.cross_entropy(logits.flatten(0, 1), targets.flatten()) and every parameter's
gradient, in three cases:
  untied         out_head separate from tok_emb
  untied_ignore  the same with every 5th target -100 (F.cross_entropy's ignore_index)
  tied           out_head.weight = tok_emb.weight (GPT-2's weight tying), with ignored targets

As oracle_gpt.py, reruns itself with ATEN_CPU_CAPABILITY=avx2 when torch
picked another kernel (attn's initialisation follows the AVX2 one).
"""
import pathlib
import random
import sys

import torch
import torch.nn.functional as F

import book_gpt as bg
from oracle_util import cpu_capability, run_under_avx2, tensor_json, write_json

SMALL = {"vocab_size": 64, "context_length": 16, "emb_dim": 32, "n_heads": 4,
         "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
B, T = 3, 13


def case(tied: bool, ignore_every: int) -> dict:
    rng = random.Random(41)
    x = [rng.randrange(SMALL["vocab_size"]) for _ in range(B * T)]
    y = [rng.randrange(SMALL["vocab_size"]) for _ in range(B * T)]
    if ignore_every:
        y = [-100 if i % ignore_every == 2 else t for i, t in enumerate(y)]
    torch.manual_seed(123)
    model = bg.GPTModel(SMALL)
    if tied:
        model.out_head.weight = model.tok_emb.weight
    model.train()
    logits = model(torch.tensor(x).view(B, T))
    loss = F.cross_entropy(logits.flatten(0, 1), torch.tensor(y))
    loss.backward()
    return {"config": SMALL, "tied": tied, "seed": 123, "B": B, "T": T, "ids": x, "targets": y,
            "loss": float(loss),
            "grads": {n: tensor_json(p.grad) for n, p in model.named_parameters()}}


def compute(out_dir: pathlib.Path) -> None:
    payload = {
        "torch": torch.__version__,
        "cpu_capability": cpu_capability(),
        "cases": {"untied": case(False, 0), "untied_ignore": case(False, 5),
                  "tied": case(True, 5)},
    }
    write_json(pathlib.Path(out_dir) / "fused_ce.json", payload)


def generate(out_dir) -> None:
    run_under_avx2(__file__, out_dir, compute)


if __name__ == "__main__":
    torch.set_num_threads(1)
    compute(pathlib.Path(sys.argv[1]))
