#!/usr/bin/env python3
"""Times one training step of the character-level GPT in attn and in PyTorch,
side by side in one run (issue 8's yardstick; docs/training.md has the tables).

Run with PyTorch 2.x from pip in a virtual environment (benchmarks only):
    scripts/bench-venv   # ~/venv-torch2: PyTorch 2.x, tiktoken, transformers from PyPI
    ~/venv-torch2/bin/python bench/compare_train_torch.py --attn build/attn \\
        --text data/tinyshakespeare.txt --recipe small --rounds 3
or with Debian's PyTorch 1.13 (/usr/bin/python3).

--dtype bfloat16 times mixed precision on both sides: `attn train --dtype
bfloat16` against the same PyTorch models with forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16) (fp32 master weights, AdamW in fp32).

Recipes (nanoGPT's Shakespeare-character settings; no dropout):
  small  4 layers, 4 heads, emb 128, context 64, batch 12
  large  6 layers, 6 heads, emb 384, context 256, batch 64
and GPT-2 124M (the book's GPT_CONFIG_124M: 12 layers, 12 heads, emb 768, vocabulary
50,257, out_head not tied, no q|k|v bias; no dropout), on GPT-2 BPE token ids:
  124m-ch5     batch 2 x context 256 (the book's chapter-5 shape)
  124m-8x1024  batch 8 x context 1024
For the 124M recipes attn trains with --tokenizer gpt2 on --text (GPT-2's BPE of
the text, the book's chapter-5 loader) and PyTorch on random token ids in
[0, 50257) (torch.randint under manual_seed(1337)): the data do not change the
work of a step.

Under load (--load quiet,busy): "busy" runs each measurement beside a fixed
busy loop pinned to the last core (one Python process spinning; a shared
machine's other tenant), so the table shows what a step costs when a core is
taken and, per implementation and thread count, the slowdown busy / quiet.
OpenMP's fork-join waits for its slowest thread, so a team whose thread
shares a core with the loop runs at that thread's pace.

Peak memory: the largest resident set (ru_maxrss from wait4) of each worker
process, start-up, data and (attn) its checkpoint writes included. A worker
whose resident set passes --mem-limit-gb (default 11 GiB; the driver reads
/proc/PID/status every 50 ms) is killed before it exhausts the shared machine
and reported as "out of memory" at that limit.
One step is what both trainers do per iteration: a random batch, forward,
mean cross-entropy, backward, global-norm clipping to 1.0, the learning rate of
the warm-up + cosine schedule, AdamW (betas 0.9, 0.99, weight decay 0.1 on the
2-D parameters). The figure is the median step time over --iters steps after
--warmup steps, each side in its own process.

PyTorch is timed as two models and the faster one counts:
  torch-book  the book's GPTModel (tests/torch/book_gpt.py), as the chapter writes it
  torch-sdpa  the same parameters with nanoGPT's fast pieces: one causal
              F.scaled_dot_product_attention, F.layer_norm, F.gelu(tanh)
attn is `attn train` with --max-iters = warm-up + iters and one evaluation at
the end; its metrics.jsonl gives the median time of all those steps.
Every implementation runs with 1 and 2 threads and the faster counts; with
--rounds N the whole set is measured N times, interleaved, and each side's
best median counts, so a load passing over the shared machine hits both.
"""
import argparse
import json
import math
import os
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

RECIPES = {
    "small": dict(n_layers=4, n_heads=4, emb_dim=128, context_length=64, batch_size=12),
    "large": dict(n_layers=6, n_heads=6, emb_dim=384, context_length=256, batch_size=64),
    "124m-ch5": dict(n_layers=12, n_heads=12, emb_dim=768, context_length=256, batch_size=2,
                     gpt2=True),
    "124m-8x1024": dict(n_layers=12, n_heads=12, emb_dim=768, context_length=1024, batch_size=8,
                        gpt2=True),
}
GPT2_VOCAB = 50257


class OutOfMemory(Exception):
    """A worker died of the address-space limit (or the kernel's OOM killer)."""


# ---------------------------------------------------------------- worker side
def torch_worker(impl, recipe, text_path, warmup, iters, threads, dtype):
    import contextlib
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests", "torch"))
    import book_gpt

    r = RECIPES[recipe]
    if r.get("gpt2"):  # random GPT-2 token ids: the same work per step as real BPE ids
        vocab_size = GPT2_VOCAB
        torch.manual_seed(1337)
        train = torch.randint(0, GPT2_VOCAB, (300_000,), dtype=torch.long)
    else:
        with open(text_path, encoding="utf-8") as f:
            text = f.read()
        chars = sorted(set(text))
        vocab_size = len(chars)
        stoi = {c: i for i, c in enumerate(chars)}
        data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
        n_train = int(0.9 * len(data))
        train = data[:n_train]
    cfg = dict(vocab_size=vocab_size, context_length=r["context_length"], emb_dim=r["emb_dim"],
               n_heads=r["n_heads"], n_layers=r["n_layers"], drop_rate=0.0, qkv_bias=False)
    torch.manual_seed(1337)
    model = book_gpt.GPTModel(cfg)
    if impl == "torch-sdpa":
        patch_fast(model, cfg)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), eps=1e-8)
    B, T = r["batch_size"], r["context_length"]
    # bf16: mixed precision as PyTorch users write it (fp32 master weights).
    autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == "bfloat16"
                else contextlib.nullcontext)

    def lr_at(it, max_iters=2000, warm=100, lr=1e-3, min_lr=1e-4):
        if it < warm:
            return lr * (it + 1) / (warm + 1)
        ratio = (it - warm) / (max_iters - warm)
        return min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (lr - min_lr)

    times = []
    for it in range(warmup + iters):
        t0 = time.perf_counter()
        ix = torch.randint(len(train) - T, (B,))
        x = torch.stack([train[i:i + T] for i in ix])
        y = torch.stack([train[i + 1:i + 1 + T] for i in ix])
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        with autocast():
            logits = model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if it >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"ms_per_iter": statistics.median(times), "loss": float(loss)}))


def patch_fast(model, cfg):
    """Swaps the book's layers' forwards for PyTorch's fused ones (same parameters)."""
    import torch.nn.functional as F

    H = cfg["n_heads"]
    for block in model.trf_blocks:
        att = block.att

        def att_forward(x, att=att):
            b, t, d = x.shape
            q = att.W_query(x).view(b, t, H, d // H).transpose(1, 2)
            k = att.W_key(x).view(b, t, H, d // H).transpose(1, 2)
            v = att.W_value(x).view(b, t, H, d // H).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return att.out_proj(o.transpose(1, 2).reshape(b, t, d))

        att.forward = att_forward
    for norm in [m for m in model.modules() if type(m).__name__ == "LayerNorm"]:
        norm.forward = (lambda x, n=norm: F.layer_norm(x, (x.shape[-1],), n.scale, n.shift, n.eps))
    for gelu in [m for m in model.modules() if type(m).__name__ == "GELU"]:
        gelu.forward = lambda x: F.gelu(x, approximate="tanh")


# ---------------------------------------------------------------- driver side
def rss_mib_of(pid):
    """The resident set of a running process (VmRSS), in MiB; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_measured(cmd, env, mem_limit_gb):
    """Runs cmd, watching its resident set every 50 ms; returns (stdout, max RSS in MiB, from
    wait4's ru_maxrss). A worker whose resident set passes mem_limit_gb is killed and
    OutOfMemory raised (so is one that fails with an allocation error); RuntimeError otherwise."""
    limit_mib = mem_limit_gb * 1024
    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:
        proc = subprocess.Popen(cmd, env=env, stdout=fout, stderr=ferr, text=True)
        killed = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # the child's own rusage
            if pid != 0:
                break
            if not killed and rss_mib_of(proc.pid) > limit_mib:
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        fout.seek(0)
        ferr.seek(0)
        out, err = fout.read(), ferr.read()
    rss_mib = usage.ru_maxrss / 1024  # KiB on Linux
    if killed or proc.returncode != 0:
        text = (err or "") + (out or "")
        if killed:
            raise OutOfMemory(f"out of memory (resident set above {mem_limit_gb:g} GiB)")
        if proc.returncode == -signal.SIGKILL:  # the kernel's OOM killer (dmesg names it)
            raise OutOfMemory(f"out of memory (killed by the kernel at {rss_mib:,.0f} MiB)")
        if any(k in text for k in ("MemoryError", "out of memory", "bad_alloc", "DefaultCPUAllocator",
                                   "Cannot allocate")):
            raise OutOfMemory(f"out of memory (allocation failed at {rss_mib:,.0f} MiB)")
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {text.strip()[-500:]}")
    return out, rss_mib


def time_torch(python, impl, args, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [python, os.path.abspath(__file__), "--worker", impl, "--recipe", args.recipe,
           "--text", args.text, "--warmup", str(args.warmup), "--iters", str(args.iters),
           "--threads", str(threads), "--dtype", args.dtype]
    out, rss = run_measured(cmd, env, args.mem_limit_gb)
    return json.loads(out.strip().splitlines()[-1])["ms_per_iter"], rss


def time_attn(args, threads, fused_loss=True):
    r = RECIPES[args.recipe]
    out_dir = tempfile.mkdtemp(prefix="attn_train_bench_")
    try:
        steps = args.warmup + args.iters
        cmd = [args.attn, "train", "--text", args.text, "--out", out_dir, "--max-iters", str(steps),
               "--eval-interval", str(steps), "--eval-iters", "1", "--threads", str(threads),
               "--n-layers", str(r["n_layers"]), "--n-heads", str(r["n_heads"]),
               "--emb-dim", str(r["emb_dim"]), "--context-length", str(r["context_length"]),
               "--batch-size", str(r["batch_size"]), "--dtype", args.dtype,
               "--fused-loss", "true" if fused_loss else "false"]
        if r.get("gpt2"):
            cmd += ["--tokenizer", "gpt2"]
        env = dict(os.environ, CI="1")
        _, rss = run_measured(cmd, env, args.mem_limit_gb)
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        # median of all steps (the few warm-up ones barely move it)
        return lines[-1]["ms_per_iter"], rss
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


class BusyCore:
    """A fixed busy loop on the last core for the life of a `with` block."""

    def __init__(self, on):
        self.on, self.proc = on, None

    def __enter__(self):
        if self.on:
            cpu = max(os.sched_getaffinity(0))
            self.proc = subprocess.Popen(
                [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
            time.sleep(0.2)  # running before the measurement starts
        return self

    def __exit__(self, *exc):
        if self.proc:
            self.proc.kill()
            self.proc.wait()


def measure(spec, a, t):
    """spec: an implementation, or IMPL@DTYPE for another dtype than --dtype (so that one run
    can interleave fp32 and bf16: --impls attn,attn@bfloat16)."""
    impl, _, dtype = spec.partition("@")
    if dtype:
        a = argparse.Namespace(**dict(vars(a), dtype=dtype))
    if impl == "attn":
        return time_attn(a, t)
    if impl == "attn-plain":  # the unfused output head and loss (--fused-loss false)
        return time_attn(a, t, fused_loss=False)
    return time_torch(a.python, impl, a, t)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default="build/attn")
    p.add_argument("--python", default=sys.executable, help="the Python whose torch is timed")
    p.add_argument("--text", default="data/tinyshakespeare.txt")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="small")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--impls", default="attn,torch-book,torch-sdpa",
                   help="attn, attn-plain (--fused-loss false), torch-book, torch-sdpa; IMPL@bfloat16 "
                        "or IMPL@float32 overrides --dtype for that one")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16: attn train --dtype bfloat16 against torch.autocast(cpu, bfloat16)")
    p.add_argument("--load", default="quiet",
                   help="quiet, busy or quiet,busy: busy measures beside a busy loop pinned to the last core")
    p.add_argument("--mem-limit-gb", type=float, default=11.0,
                   help="a worker whose resident set passes this many GiB is killed: out of memory")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        torch_worker(a.worker, a.recipe, a.text, a.warmup, a.iters, int(a.threads), a.dtype)
        return
    torch_version = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"],
                                   check=True, capture_output=True, text=True).stdout.strip()
    threads = [int(t) for t in a.threads.split(",")]
    impls = a.impls.split(",")
    loads = a.load.split(",")
    if any(load not in ("quiet", "busy") for load in loads):
        p.error(f"--load takes quiet, busy or both, got {a.load}")
    best, oom = {}, {}
    for rnd in range(a.rounds):
        for impl in impls:
            for t in threads:
                for load_kind in loads:
                    load = os.getloadavg()[0]
                    try:
                        with BusyCore(load_kind == "busy"):
                            ms, rss = measure(impl, a, t)
                    except OutOfMemory as e:
                        oom[impl] = str(e)
                        print(f"round {rnd + 1} {impl:10s} threads {t} {load_kind}: {e} (load {load:.1f})",
                              file=sys.stderr, flush=True)
                        continue
                    print(f"round {rnd + 1} {impl:10s} threads {t} {load_kind}: {ms:8.1f} ms/iter, "
                          f"max RSS {rss:7.0f} MiB (load {load:.1f})", file=sys.stderr, flush=True)
                    key = (impl, load_kind, t)  # the best round of each
                    if key not in best or ms < best[key][0]:
                        best[key] = (ms, t, rss)
    r = RECIPES[a.recipe]
    tokens = r["batch_size"] * r["context_length"]
    print(f"recipe {a.recipe} ({r}), {a.dtype}; PyTorch {torch_version}; median of {a.iters} steps, best of "
          f"{a.rounds} round(s) x threads {a.threads}; load {a.load}")
    for load_kind in loads:
        print(f"\n{load_kind}:")
        print("| implementation | ms/iter | tokens/s | threads | max RSS (MiB) | attn's lead |")
        print("|---|---:|---:|---:|---:|---:|")
        fastest = {}  # each implementation at its best thread count under this load
        for (impl, ld, _), r in best.items():
            if ld == load_kind and (impl not in fastest or r < fastest[impl]):
                fastest[impl] = r
        attn_ms = fastest.get("attn", (None,))[0]
        for impl in impls:
            if impl not in fastest:
                print(f"| {impl} | {oom.get(impl, 'failed')} | | | | |")
                continue
            ms, t, rss = fastest[impl]
            lead = f"{ms / attn_ms:.2f}x" if attn_ms and impl != "attn" else ""
            print(f"| {impl} | {ms:.1f} | {tokens / ms * 1e3:,.0f} | {t} | {rss:,.0f} | {lead} |")
    if len(loads) == 2:
        print("\nslowdown under load (busy / quiet, ms/iter):")
        print("| implementation | threads | quiet | busy | slowdown |")
        print("|---|---:|---:|---:|---:|")
        for impl in impls:
            for t in threads:
                q, b = best.get((impl, "quiet", t)), best.get((impl, "busy", t))
                if q and b:
                    print(f"| {impl} | {t} | {q[0]:.1f} | {b[0]:.1f} | {b[0] / q[0]:.2f}x |")


if __name__ == "__main__":
    main()
