"""Records chapter 5's training run (the notebook's cells from the training on)
under PyTorch 1.13 on CPU, once, to a committed fixture that
tests/torch/test_ch5_training_torch.cpp compares `attn walkthrough --chapter 5`
with.

What the notebook does, in its order (the same maths in our own words; the
model is the book's, tests/torch/book_gpt.py):

  train_loader / val_loader   The Verdict split 90/10 by characters, windows of
                              256 every 256 tokens, batch 2; train shuffle=True,
                              drop_last=True; validation shuffle=False,
                              drop_last=False (created under manual_seed(123),
                              which draws nothing).
  training cell               torch.manual_seed(123); model = GPTModel(
                              GPT_CONFIG_124M with context_length 256) (left in
                              train mode: the cell does not call eval());
                              AdamW(model.parameters(), lr=0.0004,
                              weight_decay=0.1); train_model_simple for 10
                              epochs, eval_freq=5, eval_iter=5, start context
                              "Every effort moves you".
  after training              model.eval(); generate_text_simple of 25 tokens
                              from "Every effort moves you"; (the decoding cells
                              on the 9-word vocabulary, which need no model and
                              are recorded by oracle_walkthrough_ch5.py); then
                              torch.manual_seed(123) and the chapter's generate
                              with max_new_tokens=15, top_k=25, temperature=1.4.

Every line the cells print is captured, with each evaluation's train and
validation loss as Python floats (their repr round-trips), tokens seen, the ids
of every sample, the wall time of the training and the CPU it ran on.

  /usr/bin/python3 tests/torch/record_ch5_training.py OUT.json [--epochs N]

The committed tests/fixtures/ch5_training/torch_1.13.json was recorded from
tests/torch/ with

  OPENBLAS_NUM_THREADS=2 ATEN_CPU_CAPABILITY=avx2 /usr/bin/python3 \
      record_ch5_training.py ../fixtures/ch5_training/torch_1.13.json

(ATen's AVX2 kernels, as the other oracles run: run_under_avx2 in
oracle_util.py), on a machine shared with other jobs, so its train_seconds is
not a benchmark.

runs with 2 threads (torch.set_num_threads(2)); ATen's CPU kernels run at the
level ATEN_CPU_CAPABILITY picks (the default: the best this CPU has), recorded in
the fixture. Run it with OPENBLAS_NUM_THREADS=2 (OpenBLAS splits a product by
rows and columns, never along K, so its sums do not depend on the count).
"""
import argparse
import contextlib
import io
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

import torch

import book_gpt as bg
from book_generate import generate_text_simple
from oracle_util import cpu_capability, write_json
from oracle_walkthrough_ch4 import gpt2_decoder
from oracle_walkthrough_ch5 import START_IDS, Bpe, make_loader

REPO = pathlib.Path(__file__).resolve().parents[2]


def calc_loss_batch(input_batch, target_batch, model):
    logits = model(input_batch)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target_batch.flatten())


def calc_loss_loader(loader, model, num_batches=None):
    """The mean of the first num_batches batch losses (all when None), as the
    book's calc_loss_loader: a new pass over the loader (which draws the
    DataLoader's base seed, and for the shuffled loader the sampler's seed, from
    the global generator), stopped after num_batches."""
    if len(loader) == 0:
        return float("nan")
    num_batches = len(loader) if num_batches is None else min(num_batches, len(loader))
    total = 0.
    for i, (input_batch, target_batch) in enumerate(loader):
        if i >= num_batches:
            break
        total += calc_loss_batch(input_batch, target_batch, model).item()
    return total / num_batches


def generate_top_k(model, idx, max_new_tokens, context_size, temperature=0.0, top_k=None):
    """The chapter's generate: keep the top_k logits (the rest -inf), divide by
    the temperature, subtract the row's max (the notebook's numerical tip; the
    softmax is the same bits either way), softmax, one torch.multinomial draw."""
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(idx[:, -context_size:])[:, -1, :]
        if top_k is not None:
            top_logits, _ = torch.topk(logits, top_k)
            logits = torch.where(logits < top_logits[:, -1], torch.tensor(float("-inf")), logits)
        if temperature > 0.0:
            logits = logits / temperature
            logits = logits - logits.max(dim=-1, keepdim=True).values
            idx_next = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
        else:
            idx_next = torch.argmax(logits, dim=-1, keepdim=True)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


def train_model_simple(model, train_loader, val_loader, optimizer, num_epochs, eval_freq,
                       eval_iter, to_text, rec, start):
    """The book's train_model_simple with evaluate_model and
    generate_and_print_sample, printing through rec (each evaluation and sample
    recorded too)."""
    tokens_seen, global_step = 0, -1
    for epoch in range(num_epochs):
        model.train()
        for input_batch, target_batch in train_loader:
            optimizer.zero_grad()
            loss = calc_loss_batch(input_batch, target_batch, model)
            loss.backward()
            optimizer.step()
            tokens_seen += input_batch.numel()
            global_step += 1
            if global_step % eval_freq == 0:
                model.eval()
                with torch.no_grad():
                    train_loss = calc_loss_loader(train_loader, model, num_batches=eval_iter)
                    val_loss = calc_loss_loader(val_loader, model, num_batches=eval_iter)
                model.train()
                rec.evaluations.append({"epoch": epoch + 1, "step": global_step,
                                        "train_loss": train_loss, "val_loss": val_loss,
                                        "tokens_seen": tokens_seen,
                                        "train_loss_repr": repr(train_loss),
                                        "val_loss_repr": repr(val_loss),
                                        "seconds": time.perf_counter() - start})
                rec.print(f"Ep {epoch+1} (Step {global_step:06d}): "
                          f"Train loss {train_loss:.3f}, Val loss {val_loss:.3f}")
        # generate_and_print_sample
        model.eval()
        with torch.no_grad():
            ids = generate_text_simple(model=model, idx=torch.tensor([START_IDS]),
                                       max_new_tokens=50, context_size=model.pos_emb.weight.shape[0])
        ids = ids.squeeze(0).tolist()
        rec.samples.append({"epoch": epoch + 1, "ids": ids})
        rec.print(to_text(ids).replace("\n", " "))
        model.train()


class Record:
    def __init__(self, echo=True):
        self.echo = echo
        self.printed = []   # every line as print() writes it, in order
        self.evaluations = []
        self.samples = []

    def print(self, *args):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            print(*args)
        text = buf.getvalue()
        if self.echo:
            sys.stdout.write(text)
            sys.stdout.flush()
        self.printed.append(text.removesuffix("\n"))


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        name = fields.get("Model name", "unknown").strip()
        family = fields.get("CPU family", "?").strip()
        cores = fields.get("CPU(s)", "?").strip()
        avx512 = "AVX-512" if " avx512f" in fields.get("Flags", "") else "AVX2"
        return f"{name} (family {family}), {cores} CPUs, {avx512}"
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--epochs", type=int, default=10)
    args = ap.parse_args()

    torch.set_num_threads(2)
    decoder = gpt2_decoder()

    def to_text(ids):
        return b"".join(decoder[int(i)] for i in ids).decode("utf-8", errors="replace")

    cfg = dict(bg.GPT_CONFIG_124M, context_length=256)
    text_data = (REPO / "data" / "the-verdict.txt").read_text(encoding="utf-8")
    bpe = Bpe()
    split_idx = int(0.90 * len(text_data))
    n = cfg["context_length"]
    torch.manual_seed(123)
    train_loader = make_loader(bpe, text_data[:split_idx], 2, n, n, shuffle=True, drop_last=True)
    val_loader = make_loader(bpe, text_data[split_idx:], 2, n, n, shuffle=False, drop_last=False)

    rec = Record()
    start = time.perf_counter()

    # The training cell.
    torch.manual_seed(123)
    model = bg.GPTModel(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0004, weight_decay=0.1)
    train_model_simple(model, train_loader, val_loader, optimizer, args.epochs, 5, 5, to_text,
                       rec, start)
    train_seconds = time.perf_counter() - start

    # After training: the trained model's 25-token greedy sample.
    model.eval()
    ids = generate_text_simple(model=model, idx=torch.tensor([START_IDS]), max_new_tokens=25,
                               context_size=cfg["context_length"]).squeeze(0).tolist()
    greedy_25 = {"ids": ids}
    rec.print("Output text:\n", to_text(ids))

    # The chapter's generate with top-k and temperature under manual_seed(123).
    torch.manual_seed(123)
    ids = generate_top_k(model, torch.tensor([START_IDS]), max_new_tokens=15,
                         context_size=cfg["context_length"], top_k=25,
                         temperature=1.4).squeeze(0).tolist()
    top_k_sample = {"ids": ids}
    rec.print("Output text:\n", to_text(ids))

    write_json(pathlib.Path(args.out), {
        "script": "tests/torch/record_ch5_training.py",
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "aten_cpu_capability": cpu_capability(),
        "threads": torch.get_num_threads(),
        "epochs": args.epochs,
        "train_seconds": train_seconds,
        "printed": rec.printed,
        "evaluations": rec.evaluations,
        "samples": rec.samples,
        "greedy_25": greedy_25,
        "top_k_25_temperature_1.4": top_k_sample,
    })


if __name__ == "__main__":
    main()
