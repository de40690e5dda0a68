#!/usr/bin/env python3
"""Times attn.scaled_dot_product_attention (the Python package, docs/python.md)
against PyTorch 2.x's torch.nn.functional.scaled_dot_product_attention in one
run, on the same tensors: forward (under torch.no_grad) and forward+backward,
(B, H, T, D) head-major inputs as PyTorch's users pass them, fp32 and bf16,
T = 256 ... 4096, for each case of --cases:

  causal      is_causal
  bool-mask   one random (T, T) bool mask (about half open, the diagonal always
              open) shared by every head: attn_mask of shape (T, T)
  float-mask  the same pattern as an additive float mask (0 / -inf), query's dtype
  gqa4        is_causal, H/4 key/value heads (enable_gqa; PyTorch >= 2.5)
  cross       256 queries against T keys, no mask

    python -m venv /tmp/attn-venv && /tmp/attn-venv/bin/pip install torch .
    /tmp/attn-venv/bin/python bench/python_sdpa.py [--dtype float32 bfloat16]
        [--T 256 512 1024 2048 4096] [--B 4] [--H 12] [--D 64] [--repeats 7]
        [--cases causal bool-mask float-mask gqa4 cross]

Both run on torch.get_num_threads() threads (attn follows PyTorch's count).
Each figure is the median of --repeats timed samples after one warm-up, a
sample being one call, or as many calls in a row as fill 5 ms; the two
implementations alternate call by call, so a load passing over the machine
hits both. Prints a Markdown table (ms and attn's speed-up).
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import attn


def timed(fn, calls=1):
    """ms per call of fn, over `calls` calls in a row."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) * 1e3 / calls


def calls_for(ms):
    """Calls per timed sample for a call of `ms`: a sample of at least 5 ms, so
    the timer and a scheduler tick do not decide a small call's figure."""
    return max(1, int(5.0 / max(ms, 1e-3)))


CASES = ("causal", "bool-mask", "float-mask", "gqa4", "cross")


def make_case(case, B, H, T, D, dtype, g):
    """(q, k, v, dout, keyword arguments) of one case, head-major."""
    Tq = 256 if case == "cross" else T
    Hkv = H // 4 if case == "gqa4" else H
    q = torch.randn(B, H, Tq, D, generator=g).to(dtype)
    k, v = (torch.randn(B, Hkv, T, D, generator=g).to(dtype) for _ in range(2))
    dout = torch.randn(B, H, Tq, D, generator=g).to(dtype)
    kwargs = {}
    if case in ("causal", "gqa4"):
        kwargs["is_causal"] = True
    if case == "gqa4":
        kwargs["enable_gqa"] = True
    if case in ("bool-mask", "float-mask"):
        allowed = torch.rand(T, T, generator=g) < 0.5
        allowed |= torch.eye(T, dtype=torch.bool)
        if case == "bool-mask":
            kwargs["attn_mask"] = allowed
        else:
            kwargs["attn_mask"] = torch.zeros(T, T).masked_fill(~allowed, float("-inf")).to(dtype)
    return q, k, v, dout, kwargs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--T", nargs="+", type=int, default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--H", type=int, default=12)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cases", nargs="+", default=["causal"], choices=CASES)
    ap.add_argument("--attn-bf16-path", default=None,
                    help="force the core's bf16 path (a name of attn._attn.bf16_paths(): "
                         "'AMX', 'widened to fp32' for attn's route before AMX was reachable "
                         "from Python, ...); default: automatic")
    args = ap.parse_args()
    if args.attn_bf16_path is not None and not attn._attn.use_bf16_path(args.attn_bf16_path):
        raise SystemExit(f"unknown bf16 path {args.attn_bf16_path!r}; this CPU has "
                         f"{attn._attn.bf16_paths()}")
    if not hasattr(F, "scaled_dot_product_attention"):
        raise SystemExit(f"needs PyTorch >= 2.0, this is {torch.__version__}")

    print(f"PyTorch {torch.__version__}, attn {attn.__version__} (kernel target "
          f"{attn.kernel_target()}), {torch.get_num_threads()} threads, "
          f"B={args.B} H={args.H} D={args.D}, attn's bf16 path "
          f"{attn._path(*(torch.empty(1, 1, 8, args.D, dtype=torch.bfloat16),) * 3, is_causal=True)!r}")
    print("| case | dtype | T | mode | PyTorch ms | attn ms | attn speed-up |")
    print("|---|---|---|---|---|---|---|")
    for case in args.cases:
        for dtype_name in args.dtype:
            dtype = getattr(torch, dtype_name)
            for T in args.T:
                g = torch.Generator().manual_seed(T)
                q, k, v, dout, kwargs = make_case(case, args.B, args.H, T, args.D, dtype, g)
                impls = {"torch": F.scaled_dot_product_attention,
                         "attn": attn.scaled_dot_product_attention}

                def forward(fn):
                    with torch.no_grad():
                        fn(q, k, v, **kwargs)

                def forward_backward(fn):
                    qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
                    fn(qq, kk, vv, **kwargs).backward(dout)

                for mode, run in (("fwd", forward), ("fwd+bwd", forward_backward)):
                    times = {name: [] for name in impls}
                    calls = {name: calls_for(timed(lambda: run(fn)))  # also the warm-up
                             for name, fn in impls.items()}
                    for _ in range(args.repeats):
                        for name, fn in impls.items():
                            times[name].append(timed(lambda: run(fn), calls[name]))
                    t_torch = statistics.median(times["torch"])
                    t_attn = statistics.median(times["attn"])
                    print(f"| {case} | {dtype_name} | {T} | {mode} | {t_torch:.3g} | {t_attn:.3g} | "
                          f"{t_torch / t_attn:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
