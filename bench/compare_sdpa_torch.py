#!/usr/bin/env python3
"""Times attn's scaled_dot_product_attention (attn/sdpa.h) against PyTorch 2.x's
torch.nn.functional.scaled_dot_product_attention on the cases of issue 20,
side by side in one run:

    scripts/bench-venv ~/venv-torch2
    ~/venv-torch2/bin/python bench/compare_sdpa_torch.py --attn build/attn

Cases (12 heads of 64, B = 1; each at T = 1024 and 4096 unless it says):
  causal      is_causal (the baseline both sides are best at)
  bool-mask   the causal pattern as a dense (T, T) boolean attn_mask
  float-mask  the same as an additive float mask (0 / -inf)
  padded-mask the causal pattern with the last T/8 keys closed too (a right-padded
              sequence), additive, the dtype's minimum where closed (as transformers
              builds it): not causal, so attn runs its masked kernels (bf16: the core's
              AMX or AVX512-BF16 kernel where it runs)
  gqa4        is_causal, 3 kv heads for 12 query heads (enable_gqa, no copies)
  cross       256 queries against 4096 keys, no mask (cross-attention; T = 4096 only)
  window512   T = 8192, causal sliding window of 512 keys before each query (attn bench
              --sliding-window-size 513: itself and the 512 before it); PyTorch
              has no window, so it gets the band as a dense boolean mask (what a
              model on PyTorch does); also attn's plain causal kernel at T = 8192
Modes: fwd, fwdbwd (forward and backward of every input). Dtypes: float32 and
bfloat16 (PyTorch's bf16 SDPA on bf16 tensors; attn's bf16 sdpa where this
build has it: a case attn refuses is shown as "-").

Every figure is a median of --repeats timed runs after a warm-up, in its own
process; each side is run with OMP_NUM_THREADS 1 and 2 and its best median
counts (--threads to pin one). With --rounds N the whole set is measured N
times interleaved and each side's best median over the rounds counts, so a
load passing over a shared machine hits both. The table goes into
docs/performance.md with the CPU it ran on.

Under load (--load quiet,busy, as compare_train_torch.py's): "busy" measures
each cell beside a fixed busy loop pinned to the last core (a shared machine's
other tenant), and the table adds each side's slowdown busy / quiet, at the
thread count that was best quiet (a loaded 2-thread team waits for the thread
that shares its core).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HEADS, HEAD_DIM = 12, 64
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_train_torch import BusyCore  # noqa: E402  (the busy loop on the last core)


def cases(quick):
    """(name, T, attn bench flags, torch worker options)."""
    out = []
    for T in ([1024] if quick else [1024, 4096]):
        out.append(("causal", T, [], {}))
        out.append(("bool-mask", T, ["--mask", "bool"], {"mask": "bool"}))
        out.append(("float-mask", T, ["--mask", "float"], {"mask": "float"}))
        out.append(("padded-mask", T, ["--mask", "padded"], {"mask": "padded"}))
        out.append(("gqa4", T, ["--kv-heads", "3"], {"kv_heads": 3}))
    out.append(("cross", 4096, ["--no-causal", "--query-tokens", "256"], {"causal": False, "query_tokens": 256}))
    if not quick:
        out.append(("window512", 8192, ["--sliding-window-size", "513"], {"window": 512}))
        out.append(("causal", 8192, [], {}))
    return out


# ---------------------------------------------------------------- worker side
def worker(opts):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(opts["threads"])
    torch.manual_seed(0)
    dtype = getattr(torch, opts["dtype"])
    T = opts["T"]
    Tq = opts.get("query_tokens") or T
    G = opts.get("kv_heads") or HEADS
    backward = opts["mode"] == "fwdbwd"
    q = torch.randn(1, HEADS, Tq, HEAD_DIM, dtype=dtype, requires_grad=backward)
    k = torch.randn(1, G, T, HEAD_DIM, dtype=dtype, requires_grad=backward)
    v = torch.randn(1, G, T, HEAD_DIM, dtype=dtype, requires_grad=backward)
    kwargs = {}
    i = torch.arange(Tq).unsqueeze(1)
    j = torch.arange(T).unsqueeze(0)
    if opts.get("mask"):
        allowed = j <= i
        if opts["mask"] == "bool":
            kwargs["attn_mask"] = allowed
        elif opts["mask"] == "padded":
            allowed = allowed & (j < T - T // 8)
            kwargs["attn_mask"] = torch.zeros(Tq, T, dtype=dtype).masked_fill(
                ~allowed, torch.finfo(dtype).min)
        else:
            kwargs["attn_mask"] = torch.zeros(Tq, T, dtype=dtype).masked_fill(~allowed, float("-inf"))
    elif opts.get("window"):
        kwargs["attn_mask"] = (j <= i) & (j >= i - opts["window"])
    elif opts.get("causal", True):
        kwargs["is_causal"] = True
    if G != HEADS:
        kwargs["enable_gqa"] = True
    dout = torch.randn(1, HEADS, Tq, HEAD_DIM, dtype=dtype)
    times = []
    for rep in range(opts["repeats"] + 2):  # two warm-up runs
        start = time.perf_counter()
        y = F.scaled_dot_product_attention(q, k, v, **kwargs)
        if backward:
            y.backward(dout)
        elapsed = (time.perf_counter() - start) * 1e3
        if rep >= 2:
            times.append(elapsed)
        if backward:
            q.grad = k.grad = v.grad = None
    print(json.dumps({"ms_median": statistics.median(times), "ms_min": min(times)}))


# ---------------------------------------------------------------- driver side
def env_for(threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("GOMP_SPINCOUNT", None)
    return env


def run_torch(python, T, opts, mode, dtype, repeats, threads):
    o = dict(opts, T=T, mode=mode, dtype=dtype, repeats=repeats, threads=threads)
    out = subprocess.run([python, os.path.abspath(__file__), "--worker", json.dumps(o)], env=env_for(threads),
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["ms_median"]


def run_attn(attn, T, flags, mode, dtype, repeats, threads):
    cmd = [attn, "bench", "--json", "--kind", "sdpa", "--batch", "1", "--tokens", str(T), "--d-model",
           str(HEADS * HEAD_DIM), "--heads", str(HEADS), "--mode", mode, "--dtype", dtype, "--repeats",
           str(repeats), "--threads", str(threads)] + flags
    p = subprocess.run(cmd, env=env_for(threads), capture_output=True, text=True)
    if p.returncode != 0:
        return None  # a case this build refuses (e.g. bf16 before it existed)
    return json.loads(p.stdout)[0]["ms_median"]


def best(values):
    values = [v for v in values if v is not None]
    return min(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--attn", default="build/attn")
    parser.add_argument("--python", default=sys.executable, help="the Python with PyTorch 2.x")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--modes", default="fwd,fwdbwd")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", default="1,2", help="thread counts each side is timed with")
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--quick", action="store_true", help="T = 1024 and the cross case only")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--load", default="quiet",
                        help="quiet, busy or quiet,busy: busy measures beside a busy loop pinned to "
                             "the last core")
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    torch_version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"], check=True,
                                   capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    threads = [int(t) for t in args.threads.split(",")]
    loads = args.load.split(",")
    if any(load not in ("quiet", "busy") for load in loads):
        parser.error(f"--load takes quiet, busy or both, got {args.load}")
    print(f"attn sdpa vs PyTorch {torch_version} F.scaled_dot_product_attention; {cpu}; {os.cpu_count()} CPUs; "
          f"12 heads of 64, B = 1; ms, best median over threads {threads} and {args.rounds} round(s)")
    header = f"{'case':<11} {'T':>5} {'dtype':<9} {'mode':<7} {'load':<5} {'attn':>9} {'torch':>9} {'torch/attn':>10}"
    if len(loads) == 2:
        header += f" {'attn busy/quiet':>15} {'torch busy/quiet':>16}"
    print(header)
    print("-" * len(header))
    rows = []
    only = set(filter(None, args.only.split(",")))
    for name, T, flags, opts in cases(args.quick):
        if only and name not in only:
            continue
        for dtype in args.dtypes.split(","):
            for mode in args.modes.split(","):
                # (load, thread count) -> medians over the rounds, each side
                a = {(ld, th): [] for ld in loads for th in threads}
                t = {(ld, th): [] for ld in loads for th in threads}
                for _ in range(args.rounds):
                    for ld in loads:
                        with BusyCore(ld == "busy"):
                            for th in threads:
                                a[(ld, th)].append(
                                    run_attn(args.attn, T, flags, mode, dtype, args.repeats, th))
                                t[(ld, th)].append(
                                    run_torch(args.python, T, opts, mode, dtype, args.repeats, th))
                quiet_a = min(threads, key=lambda th: best(a[(loads[0], th)]) or float("inf"))
                quiet_t = min(threads, key=lambda th: best(t[(loads[0], th)]) or float("inf"))
                for ld in loads:
                    ba = best([v for th in threads for v in a[(ld, th)]])
                    bt = best([v for th in threads for v in t[(ld, th)]])
                    ratio = bt / ba if ba and bt else None
                    row = {"case": name, "T": T, "dtype": dtype, "mode": mode, "load": ld,
                           "attn_ms": ba, "torch_ms": bt, "speedup": ratio, "cpu": cpu,
                           "torch": torch_version}
                    fa = f"{ba:9.2f}" if ba else f"{'-':>9}"
                    fr = f"{ratio:10.2f}" if ratio else f"{'-':>10}"
                    line = f"{name:<11} {T:>5} {dtype:<9} {mode:<7} {ld:<5} {fa} {bt:9.2f} {fr}"
                    if len(loads) == 2 and ld == "busy":
                        # each side at the thread count that was best quiet
                        sa = (best(a[("busy", quiet_a)]) or 0) / (best(a[("quiet", quiet_a)]) or 1)
                        st = (best(t[("busy", quiet_t)]) or 0) / (best(t[("quiet", quiet_t)]) or 1)
                        row.update(attn_slowdown=sa, torch_slowdown=st)
                        line += f" {sa:14.2f}x {st:15.2f}x"
                    rows.append(row)
                    print(line, flush=True)
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
