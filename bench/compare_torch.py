#!/usr/bin/env python3
"""Times attn against PyTorch on the same shapes, side by side in one run.

Run with Debian's torch 1.13:  /usr/bin/python3 bench/compare_torch.py --attn build/attn
or PyTorch 2.x from pip in a virtual environment (benchmarks only):
    scripts/bench-venv   # ~/venv-torch2: PyTorch 2.x, tiktoken, transformers from PyPI
    python3 bench/compare_torch.py --attn build/attn --python ~/venv-torch2/bin/python

For every shape (B, T, d, H; causal) and mode (forward, forward+backward) it
times, each in its own process, median of --repeats after a warm-up:
  torch-mha          torch.nn.MultiheadAttention(d, H, batch_first=True) with a causal mask
  torch-sdpa-module  one qkv Linear, causal scaled_dot_product_attention, out_proj
  torch-book         the chapter's MultiHeadAttention class (weight splits, out_proj)
  torch-sdpa         PyTorch's built-in causal scaled-dot-product core alone
  attn               `attn bench --json` for the module (and the core)
PyTorch and attn are each timed in the same environments (OMP threads 1 and 2;
GOMP_SPINCOUNT unset and 0, since OpenMP's spinning threads and OpenBLAS's
contend on small machines) and the best of them is the figure of each that is
compared (OMP_NUM_THREADS also sets OpenBLAS's thread count).
With --rounds N the whole set (every implementation in every environment) is
measured N times, interleaved, and the best median of each side over all of
them counts: a load that passes over the shared machine then hits both sides.
With --dtype bfloat16 everything runs in bf16 and beside its own fp32 figure:
the cores (PyTorch's SDPA on bf16 q, k, v against `attn bench --kind core
--dtype bfloat16`) and the modules (the SDPA module under
torch.autocast("cpu", dtype=torch.bfloat16) against attn's MultiHeadAttention
with dtype = kBFloat16: both keep fp32 weights).
The table it prints goes into docs/performance.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_SHAPES = ["1x256x768x12", "1x1024x768x12", "1x4096x768x12", "8x1024x768x12", "1x1024x768x6"]


def parse_shape(s):
    b, t, d, h = (int(x) for x in s.split("x"))
    return b, t, d, h


# ---------------------------------------------------------------- worker side
def causal_sdpa(torch):
    """PyTorch's built-in causal scaled-dot-product attention: the public
    F.scaled_dot_product_attention of 2.x, or 1.13's private one."""
    F = torch.nn.functional
    if hasattr(F, "scaled_dot_product_attention"):
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return lambda q, k, v: F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]


def book_mha_class():
    """The chapter's MultiHeadAttention, as the differential tests run it."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "torch"))
    from book_modules import MultiHeadAttention

    return MultiHeadAttention


def worker(impl, shape, mode, repeats, threads, dtype_name="float32"):
    import torch

    dtype = getattr(torch, dtype_name)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    b, t, d, h = shape
    hd = d // h
    backward = mode == "fwdbwd"
    x = torch.randn(b, t, d, requires_grad=backward)
    if impl == "torch-mha":
        m = torch.nn.MultiheadAttention(d, h, batch_first=True)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)

        def run():
            return m(x, x, x, attn_mask=mask, need_weights=False)[0]
    elif impl == "torch-book":
        m = book_mha_class()(d, d, t, 0.0, h)

        def run():
            return m(x)
    elif impl == "torch-sdpa":
        q, k, v = (torch.randn(b, h, t, hd, dtype=dtype, requires_grad=backward) for _ in range(3))

        def run():
            return causal_sdpa(torch)(q, k, v)
    elif impl == "torch-sdpa-module":
        # The fastest module PyTorch 2.x offers for this block: one qkv Linear,
        # its causal SDPA (CPU flash attention), out_proj.
        qkv = torch.nn.Linear(d, 3 * d)
        out_proj = torch.nn.Linear(d, d)
        sdpa = causal_sdpa(torch)

        def module():
            q, k, v = qkv(x).view(b, t, 3, h, hd).permute(2, 0, 3, 1, 4)  # 3 x (b, h, t, hd)
            return out_proj(sdpa(q, k, v).transpose(1, 2).reshape(b, t, d))

        def run():
            if dtype == torch.float32:
                return module()
            with torch.autocast("cpu", dtype=dtype):  # mixed precision: fp32 weights
                return module()
    else:
        raise SystemExit(f"unknown impl {impl}")
    times = []
    for i in range(repeats + 1):  # the first run is the warm-up
        start = time.perf_counter()
        y = run()
        if backward:
            y.backward(torch.ones_like(y))
        elapsed = (time.perf_counter() - start) * 1e3
        if i > 0:
            times.append(elapsed)
    print(json.dumps({"ms_median": statistics.median(times), "ms_min": min(times)}))


# ---------------------------------------------------------------- driver side
def run_torch(python, impl, shape, mode, repeats, threads, spincount, dtype="float32"):
    env = bench_env(threads, spincount)
    cmd = [python, os.path.abspath(__file__), "--worker", impl, "--shape", "x".join(map(str, shape)), "--mode", mode,
           "--repeats", str(repeats), "--threads", str(threads), "--dtype", dtype]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench_env(threads, spincount):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("GOMP_SPINCOUNT", None)
    if spincount is not None:
        env["GOMP_SPINCOUNT"] = spincount
    return env


def run_attn(attn, kind, shape, mode, repeats, threads, spincount, dtype="float32"):
    b, t, d, h = shape
    cmd = [attn, "bench", "--json", "--kind", kind, "--batch", str(b), "--tokens", str(t), "--d-model", str(d),
           "--heads", str(h), "--mode", mode, "--repeats", str(repeats), "--dtype", dtype]
    out = subprocess.run(cmd, env=bench_env(threads, spincount), check=True, capture_output=True,
                         text=True).stdout
    rows = json.loads(out)
    return rows[0]


def best_attn(attn, kind, shape, mode, repeats, envs, dtype="float32"):
    results = []
    for threads, spin in envs:
        r = run_attn(attn, kind, shape, mode, repeats, threads, spin, dtype)
        r.update(threads=threads, spincount=spin)
        results.append(r)
    best = min(results, key=lambda r: r["ms_median"])
    best["all"] = [{k: r[k] for k in ("ms_median", "ms_min", "threads", "spincount")} for r in results]
    return best


# (OMP_NUM_THREADS, GOMP_SPINCOUNT) pairs every side is timed under; each side's best counts.
ENVS = [(1, None), (2, None), (2, "0")]


def torch_version_of(python):
    return subprocess.run([python, "-c", "import torch; print(torch.__version__)"], check=True,
                          capture_output=True, text=True).stdout.strip()


def write_json_atomically(path, rows):
    """The rows as JSON: a temporary file beside path, then renamed over it."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(tmp, path)


def compare_bf16(args):
    """attn's bf16 core and module against PyTorch's, and each against its own fp32 figure."""
    envs = ENVS
    rows = []
    torch_version = torch_version_of(args.python)
    print(f"PyTorch {torch_version} ({args.python}); causal, ms median; module = qkv Linear, SDPA, out_proj")
    header = (f"{'shape BxTxDxH':>15} {'kind':>6} {'mode':>7} {'attn bf16':>10} {'torch bf16':>11} {'x bf16':>7} "
              f"{'attn fp32':>10} {'torch fp32':>11} {'attn bf16/fp32':>15}")
    print(header)
    print("-" * len(header))
    for s in args.shapes.split(","):
        shape = parse_shape(s)
        for kind, torch_impl in (("core", "torch-sdpa"), ("module", "torch-sdpa-module")):
            for mode in args.modes.split(","):
                runs = {key: [] for key in ("attn-bf16", "attn-fp32", "torch-bf16", "torch-fp32")}
                for _ in range(args.rounds):
                    for dtype, tag in (("bfloat16", "bf16"), ("float32", "fp32")):
                        for threads, spin in envs:
                            r = run_torch(args.python, torch_impl, shape, mode, args.repeats, threads, spin, dtype)
                            r.update(threads=threads, spincount=spin)
                            runs["torch-" + tag].append(r)
                        runs["attn-" + tag].append(best_attn(args.attn, kind, shape, mode, args.repeats, envs, dtype))
                best = {key: min(results, key=lambda r: r["ms_median"]) for key, results in runs.items()}
                ms = {key: r["ms_median"] for key, r in best.items()}
                rows.append({"shape": s, "kind": kind, "mode": mode, "best": best})
                print(f"{s:>15} {kind:>6} {mode:>7} {ms['attn-bf16']:10.2f} {ms['torch-bf16']:11.2f} "
                      f"{ms['torch-bf16'] / ms['attn-bf16']:7.2f} {ms['attn-fp32']:10.2f} {ms['torch-fp32']:11.2f} "
                      f"{ms['attn-fp32'] / ms['attn-bf16']:15.2f}", flush=True)
    print("\nms are medians, each the best over OMP_NUM_THREADS in {1, 2} and GOMP_SPINCOUNT in {unset, 0} "
          f"({args.rounds} interleaved round(s)); x bf16 = torch bf16 ms / attn bf16 ms; "
          "attn bf16/fp32 = attn fp32 ms / attn bf16 ms.")
    if args.json_out:
        write_json_atomically(args.json_out, rows)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default="build/attn", help="path of the attn executable")
    p.add_argument("--python", default=sys.executable,
                   help="the Python whose torch is timed (e.g. a virtual environment's with PyTorch 2.x)")
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="BxTxDxH,... (causal)")
    p.add_argument("--modes", default="fwd,fwdbwd")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-book-above", type=int, default=4096,
                   help="skip the book class above this T (it materialises B*H*T*T floats)")
    p.add_argument("--rounds", type=int, default=1,
                   help="passes over every implementation and environment, interleaved; each side's best median "
                        "over all of them counts (a passing load on the shared machine then hits both sides alike)")
    p.add_argument("--json-out", default="")
    p.add_argument("--worker", default="")
    p.add_argument("--shape", default="")
    p.add_argument("--mode", default="fwd")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="bfloat16: the cores only, attn's bf16 kernels against SDPA on bf16 tensors")
    args = p.parse_args()
    if args.worker:
        worker(args.worker, parse_shape(args.shape), args.mode, args.repeats, args.threads, args.dtype)
        return 0
    if args.dtype == "bfloat16":
        return compare_bf16(args)

    envs = ENVS
    rows = []
    torch_version = torch_version_of(args.python)
    print(f"PyTorch {torch_version} ({args.python})")
    header = (f"{'shape BxTxDxH':>15} {'mode':>7} {'attn module':>12} {'torch MHA':>10} {'sdpa mod':>9} "
              f"{'book MHA':>10} {'x vs best':>9} {'x vs book':>9} {'attn core':>10} {'torch core':>11} "
              f"{'x core':>7}")
    print(header)
    print("-" * len(header))
    for s in args.shapes.split(","):
        shape = parse_shape(s)
        for mode in args.modes.split(","):
            impls = [i for i in ("torch-mha", "torch-sdpa-module", "torch-book", "torch-sdpa")
                     if not (i == "torch-book" and shape[1] > args.skip_book_above)]
            torch_runs = {impl: [] for impl in impls}
            attn_runs = {"module": [], "core": []}
            for _ in range(args.rounds):
                for impl in impls:
                    for threads, spin in envs:
                        r = run_torch(args.python, impl, shape, mode, args.repeats, threads, spin)
                        r.update(threads=threads, spincount=spin)
                        torch_runs[impl].append(r)
                for kind in attn_runs:
                    attn_runs[kind].append(best_attn(args.attn, kind, shape, mode, args.repeats, envs))
            best = {}
            for impl, results in torch_runs.items():
                best[impl] = dict(min(results, key=lambda r: r["ms_median"]))
                best[impl]["all"] = [dict(r) for r in results]  # copies: no circular reference
            module, core = (min(attn_runs[kind], key=lambda r: r["ms_median"]) for kind in ("module", "core"))
            row = {"shape": s, "mode": mode, "attn_module": module, "attn_core": core, "torch": best}
            rows.append(row)

            def ms(r):
                return f"{r['ms_median']:10.1f}" if r else f"{'-':>10}"

            book = best.get("torch-book")
            ratio_book = f"{book['ms_median'] / module['ms_median']:9.2f}" if book else f"{'-':>9}"
            best_module = min(best["torch-mha"]["ms_median"], best["torch-sdpa-module"]["ms_median"])
            print(f"{s:>15} {mode:>7} {module['ms_median']:12.1f} {ms(best['torch-mha'])} "
                  f"{best['torch-sdpa-module']['ms_median']:9.1f} {ms(book)} "
                  f"{best_module / module['ms_median']:9.2f} {ratio_book} "
                  f"{core['ms_median']:10.1f} {best['torch-sdpa']['ms_median']:11.1f} "
                  f"{best['torch-sdpa']['ms_median'] / core['ms_median']:7.2f}", flush=True)
    print("\nms are medians; torch and attn figures are each the best over OMP_NUM_THREADS in {1, 2} and "
          f"GOMP_SPINCOUNT in {{unset, 0}} ({args.rounds} interleaved round(s)); x = torch ms / attn ms; "
          "'x vs best' is against the faster of torch's nn.MultiheadAttention and the SDPA module.")
    if args.json_out:
        write_json_atomically(args.json_out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
