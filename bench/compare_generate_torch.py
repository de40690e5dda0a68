#!/usr/bin/env python3
"""Greedy generation with a KV cache on GPT_CONFIG_124M (random weights): attn
against the book's KV-cache GPT on PyTorch, side by side in one run (issue 8's
yardstick; docs/generation.md has the tables).

Run with PyTorch 2.x from pip in a virtual environment (benchmarks only):
    ~/venv-torch2/bin/python bench/compare_generate_torch.py --attn build/attn --rounds 3
or with Debian's PyTorch 1.13 (/usr/bin/python3).

PyTorch side: the book's KV-cache GPT (LLMs-from-scratch, ch04/03_kv-cache,
gpt_with_kv_cache.py) as that file designs it: the chapter-4 GPTModel of
tests/torch/book_gpt.py whose attention keeps per-layer key and value tensors
grown by torch.cat, positions continuing from the cache's length, and
generate_text_simple_cached: one forward over the prompt, then one per new
token, argmax each time, under torch.no_grad() in eval mode.
attn side: `attn generate --config 124m --benchmark` (the same model, prompt
and token counts; its "cache:" line).
Both report prompt processing (prompt tokens / time of the prefill) and
generation (new tokens after the first / their time). Each side runs in its
own process, with 1 and 2 threads; with --rounds N everything is measured N
times, interleaved, and each side's best counts.
"""
import argparse
import os
import re
import subprocess
import sys
import time

GPT_CONFIG_124M = {"vocab_size": 50257, "context_length": 1024, "emb_dim": 768, "n_heads": 12,
                   "n_layers": 12, "drop_rate": 0.1, "qkv_bias": False}


# ---------------------------------------------------------------- worker side
def torch_worker(prompt_tokens, new_tokens, threads):
    import torch

    torch.set_num_threads(threads)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests", "torch"))
    import book_gpt

    torch.manual_seed(123)
    model = book_gpt.GPTModel(GPT_CONFIG_124M)
    add_kv_cache(model)
    model.eval()
    idx = torch.randint(0, GPT_CONFIG_124M["vocab_size"], (1, prompt_tokens))
    with torch.no_grad():
        model.reset_kv_cache()  # warm-up: one short generation
        logits = model(idx[:, :8], use_cache=True)
        model(logits[:, -1].argmax(dim=-1, keepdim=True), use_cache=True)

        model.reset_kv_cache()
        t0 = time.perf_counter()
        logits = model(idx, use_cache=True)  # prefill
        t1 = time.perf_counter()
        for _ in range(new_tokens - 1):
            next_idx = logits[:, -1].argmax(dim=-1, keepdim=True)
            idx = torch.cat([idx, next_idx], dim=1)
            logits = model(next_idx, use_cache=True)
        t2 = time.perf_counter()
    print(f"prompt {prompt_tokens / (t1 - t0):.2f} generation {(new_tokens - 1) / (t2 - t1):.3f}")


def add_kv_cache(model):
    """Gives the book's chapter-4 model the KV cache of ch04/03_kv-cache."""
    import torch

    for block in model.trf_blocks:
        att = block.att
        att.cache_k = att.cache_v = None

        def att_forward(x, use_cache=False, att=att):
            b, n, _ = x.shape
            k_new = att.W_key(x).view(b, n, att.num_heads, att.head_dim)
            v_new = att.W_value(x).view(b, n, att.num_heads, att.head_dim)
            q = att.W_query(x).view(b, n, att.num_heads, att.head_dim)
            if use_cache:
                if att.cache_k is None:
                    att.cache_k, att.cache_v = k_new, v_new
                else:
                    att.cache_k = torch.cat([att.cache_k, k_new], dim=1)
                    att.cache_v = torch.cat([att.cache_v, v_new], dim=1)
                k, v = att.cache_k, att.cache_v
            else:
                k, v = k_new, v_new
            k, q, v = k.transpose(1, 2), q.transpose(1, 2), v.transpose(1, 2)
            scores = q @ k.transpose(2, 3)
            scores.masked_fill_(att.mask.bool()[:n, :n], -torch.inf)  # as the book's file does
            weights = torch.softmax(scores / k.shape[-1] ** 0.5, dim=-1)
            ctx = (att.dropout(weights) @ v).transpose(1, 2).contiguous().view(b, n, att.d_out)
            return att.out_proj(ctx)

        att.forward = att_forward

        def block_forward(x, use_cache=False, block=block):
            x = block.drop_shortcut(block.att(block.norm1(x), use_cache=use_cache)) + x
            return block.drop_shortcut(block.ff(block.norm2(x))) + x

        block.forward = block_forward

    model.current_pos = 0

    def model_forward(in_idx, use_cache=False):
        n = in_idx.shape[1]
        if use_cache:
            pos = torch.arange(model.current_pos, model.current_pos + n, dtype=torch.long)
            model.current_pos += n
        else:
            pos = torch.arange(0, n, dtype=torch.long)
        x = model.drop_emb(model.tok_emb(in_idx) + model.pos_emb(pos).unsqueeze(0))
        for blk in model.trf_blocks:
            x = blk(x, use_cache=use_cache)
        return model.out_head(model.final_norm(x))

    def reset_kv_cache():
        for blk in model.trf_blocks:
            blk.att.cache_k = blk.att.cache_v = None
        model.current_pos = 0

    model.forward = model_forward
    model.reset_kv_cache = reset_kv_cache


# ---------------------------------------------------------------- driver side
def time_torch(python, prompt_tokens, new_tokens, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([python, os.path.abspath(__file__), "--worker", "--prompt-tokens", str(prompt_tokens),
                          "--new-tokens", str(new_tokens), "--threads", str(threads)],
                         env=env, check=True, capture_output=True, text=True).stdout
    m = re.search(r"prompt ([\d.]+) generation ([\d.]+)", out)
    return float(m.group(1)), float(m.group(2))


def time_attn(attn, prompt_tokens, new_tokens, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([attn, "generate", "--config", "124m", "--benchmark", "--prompt-tokens",
                          str(prompt_tokens), "--max-new-tokens", str(new_tokens)],
                         env=env, check=True, capture_output=True, text=True).stdout
    m = re.search(r"cache:\s+prompt processing\s+([\d.]+) tokens/s.*generation\s+([\d.]+) tokens/s", out)
    return float(m.group(1)), float(m.group(2))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default="build/attn")
    p.add_argument("--python", default=sys.executable, help="the Python whose torch is timed")
    p.add_argument("--cases", default="64+64,256+16", help="prompt+new token counts")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prompt-tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--new-tokens", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        torch_worker(a.prompt_tokens, a.new_tokens, int(a.threads))
        return
    torch_version = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"],
                                   check=True, capture_output=True, text=True).stdout.strip()
    threads = [int(t) for t in a.threads.split(",")]
    cases = [tuple(int(x) for x in c.split("+")) for c in a.cases.split(",")]
    best = {}
    for rnd in range(a.rounds):
        for case in cases:
            for side in ("attn", "torch"):
                for t in threads:
                    pp, gen = (time_attn(a.attn, *case, t) if side == "attn"
                               else time_torch(a.python, *case, t))
                    print(f"round {rnd + 1} {side:5s} {case[0]}+{case[1]} threads {t}: prompt {pp:8.1f} "
                          f"tokens/s, generation {gen:7.2f} tokens/s", file=sys.stderr, flush=True)
                    k = (case, side)
                    old = best.get(k, (0.0, 0.0))
                    best[k] = (max(old[0], pp), max(old[1], gen))
    print(f"GPT_CONFIG_124M, random weights, greedy, batch 1; PyTorch {torch_version} (the book's KV-cache "
          f"GPT); best of {a.rounds} round(s) x threads {a.threads}")
    print("| prompt + new | attn prompt tok/s | PyTorch prompt tok/s | lead | attn generation tok/s | "
          "PyTorch generation tok/s | lead |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        ap, ag = best[(case, "attn")]
        tp, tg = best[(case, "torch")]
        print(f"| {case[0]} + {case[1]} | {ap:.1f} | {tp:.1f} | {ap / tp:.2f}x | {ag:.2f} | {tg:.2f} | "
              f"{ag / tg:.2f}x |")


if __name__ == "__main__":
    main()
