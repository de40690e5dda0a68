"""The book's chapter-5 training loop (train_model_simple) on a tiny GPT, for
`attn train --recipe book-ch5` with the model flags below
(tests/torch/test_train_book_torch.cpp).

Everything but the model's size is the book's recipe: The Verdict's first
3,000 characters split 90/10 by characters, GPT-2's BPE, windows of 32 every
32 tokens, batch 2 (training shuffled, drop_last), torch.manual_seed(123)
before GPTModel, AdamW(model.parameters(), lr=0.0004, weight_decay=0.1),
dropout 0.1, 2 epochs, evaluation after every 5th step on 2 batches, a greedy
50-token sample from "Every effort moves you" after each epoch. The model:
GPT_CONFIG_124M with context_length 32, emb_dim 16, 2 heads, 1 layer. The
loop is record_ch5_training.py's (the 124M run's), printed lines, losses and
sample ids recorded the same way.

Writes train_book.json: {"config", "text_chars", "printed", "evaluations", "samples"}.
"""
import pathlib
import sys
import time

import torch

import book_gpt as bg
from oracle_util import run_under_avx2, write_json
from oracle_walkthrough_ch4 import gpt2_decoder
from oracle_walkthrough_ch5 import Bpe, make_loader
from record_ch5_training import Record, train_model_simple

REPO = pathlib.Path(__file__).resolve().parents[2]
TEXT_CHARS = 3000
CONFIG = dict(bg.GPT_CONFIG_124M, context_length=32, emb_dim=16, n_heads=2, n_layers=1)


def compute(out_dir) -> None:
    torch.set_num_threads(1)
    decoder = gpt2_decoder()

    def to_text(ids):
        return b"".join(decoder[int(i)] for i in ids).decode("utf-8", errors="replace")

    text = (REPO / "data" / "the-verdict.txt").read_text(encoding="utf-8")[:TEXT_CHARS]
    bpe = Bpe()
    split_idx = int(0.90 * len(text))
    n = CONFIG["context_length"]
    torch.manual_seed(123)
    train_loader = make_loader(bpe, text[:split_idx], 2, n, n, shuffle=True, drop_last=True)
    val_loader = make_loader(bpe, text[split_idx:], 2, n, n, shuffle=False, drop_last=False)
    rec = Record(echo=False)
    torch.manual_seed(123)
    model = bg.GPTModel(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0004, weight_decay=0.1)
    train_model_simple(model, train_loader, val_loader, optimizer, 2, 5, 2, to_text, rec,
                       time.perf_counter())
    write_json(pathlib.Path(out_dir) / "train_book.json", {
        "config": CONFIG, "text_chars": TEXT_CHARS, "printed": rec.printed,
        "evaluations": rec.evaluations, "samples": rec.samples})


def generate(out_dir) -> None:
    run_under_avx2(__file__, out_dir, compute)


if __name__ == "__main__":
    compute(pathlib.Path(sys.argv[1]))
