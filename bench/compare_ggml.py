#!/usr/bin/env python3
"""Times attn's fused attention core against ggml's CPU flash attention, side by side in one run.

ggml is not in Debian 12's archive, so this script is not part of the build or
of CI; it needs the ggml-python bindings, which build ggml from source:

    python3 -m venv /tmp/ggml-venv
    /tmp/ggml-venv/bin/pip install ggml-python==0.0.45     # ggml 0.15.3, built with -march=native
    /tmp/ggml-venv/bin/python bench/compare_ggml.py --attn build/attn

What is timed, each in its own process, median of --repeats after a warm-up,
and each side's best median over --rounds processes (the machine is shared):
  ggml-f32  ggml_flash_attn_ext on F32 q, k, v with a causal F16 mask (ggml's
            tiled CPU kernel; ggml has no backward for it), n_threads threads
  ggml-f16  the same with k, v in F16, the layout llama.cpp's KV cache uses
  attn      `attn bench --json --kind core --mode fwd`: the fused kernel, fp32
Shapes are B x T x H x hd, causal; ggml computes every key tile of the mask
(it masks inside tiles), attn skips the tiles above the diagonal, so both are
reported in useful causal GFLOP/s = 4·B·H·T²·hd/2 / median.
Before timing, ggml's output on a small case is checked against a numpy
softmax attention, so the mask and layouts are known to be the causal ones.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_SHAPES = ["1x256x12x64", "1x1024x12x64", "1x4096x12x64", "8x1024x12x64", "1x1024x6x128"]


def parse_shape(s):
    b, t, h, hd = (int(x) for x in s.split("x"))
    return b, t, h, hd


def causal_flops(b, t, h, hd):
    return 4.0 * b * h * t * t * hd / 2.0


# ---------------------------------------------------------------- worker side (ggml)
def ggml_attention(b, t, h, hd, kv_type, threads, seed=0):
    """Builds q, k, v, a causal mask and the flash_attn_ext graph; returns (run, out, q, k, v)."""
    import ctypes

    import ggml
    import ggml.utils
    import numpy as np

    f32 = 4
    kv_size = 2 if kv_type == "f16" else 4
    mem = (b * t * h * hd * (f32 * 2 + kv_size * 2) + t * t * 2 + (64 << 20))
    params = ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False)
    ctx = ggml.ggml_init(params)
    typ = ggml.GGML_TYPE_F16 if kv_type == "f16" else ggml.GGML_TYPE_F32
    # ggml's dims run innermost first: q [hd, T, H, B], k and v [hd, T, H, B] (not transposed).
    q = ggml.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F32, hd, t, h, b)
    k = ggml.ggml_new_tensor_4d(ctx, typ, hd, t, h, b)
    v = ggml.ggml_new_tensor_4d(ctx, typ, hd, t, h, b)
    mask = ggml.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F16, t, t, 1, 1)  # [n_kv, n_queries]
    rng = np.random.default_rng(seed)
    qn, kn, vn = (rng.standard_normal((b, h, t, hd), dtype=np.float32) for _ in range(3))
    ggml.utils.to_numpy(q)[...] = qn
    ggml.utils.to_numpy(k)[...] = kn.astype(np.float16 if kv_type == "f16" else np.float32)
    ggml.utils.to_numpy(v)[...] = vn.astype(np.float16 if kv_type == "f16" else np.float32)
    # mask[i, j] = -inf for keys j > query i, 0 elsewhere.
    ggml.utils.to_numpy(mask)[...] = np.triu(np.full((t, t), -np.inf, dtype=np.float16), k=1)
    out = ggml.ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0 / hd ** 0.5, 0.0, 0.0)
    ggml.ggml_flash_attn_ext_set_prec(out, ggml.GGML_PREC_F32)
    graph = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(graph, out)

    def run():
        ggml.ggml_graph_compute_with_ctx(ctx, graph, threads)

    def result():  # out is [hd, H, T, B] (permuted): back to (B, H, T, hd)
        return np.ascontiguousarray(ggml.utils.to_numpy(out).transpose(0, 2, 1, 3))

    keep = (ctx, ctypes)  # the context owns every buffer: keep it alive with the closures
    return run, result, (qn, kn, vn), keep


def reference(qn, kn, vn):
    import numpy as np

    t, hd = qn.shape[-2], qn.shape[-1]
    s = (qn.astype(np.float64) @ kn.astype(np.float64).swapaxes(-1, -2)) / hd ** 0.5
    s = s + np.triu(np.full((t, t), -np.inf), k=1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ vn.astype(np.float64)


def check(kv_type, threads):
    """ggml against numpy on a small causal case; returns the largest difference."""
    import numpy as np

    run, result, (qn, kn, vn), _keep = ggml_attention(2, 70, 3, 64, kv_type, threads, seed=1)
    run()
    err = float(np.max(np.abs(result() - reference(qn, kn, vn))))
    tol = 2e-2 if kv_type == "f16" else 1e-4
    if not err <= tol:
        raise SystemExit(f"ggml-{kv_type} differs from the numpy reference by {err} > {tol}")
    return err


def worker(kv_type, shape, repeats, threads):
    err = check(kv_type, threads)
    run, _result, _inputs, _keep = ggml_attention(*shape, kv_type, threads)
    times = []
    for i in range(repeats + 1):  # the first run is the warm-up
        start = time.perf_counter()
        run()
        elapsed = (time.perf_counter() - start) * 1e3
        if i > 0:
            times.append(elapsed)
    print(json.dumps({"ms_median": statistics.median(times), "ms_min": min(times), "check_err": err}))


# ---------------------------------------------------------------- driver side
def run_ggml(kv_type, shape, repeats, threads):
    cmd = [sys.executable, __file__, "--worker", kv_type, "--shape", "x".join(map(str, shape)),
           "--repeats", str(repeats), "--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_attn(attn, shape, repeats, threads):
    b, t, h, hd = shape
    cmd = [attn, "bench", "--json", "--kind", "core", "--mode", "fwd", "--batch", str(b), "--tokens", str(t),
           "--d-model", str(h * hd), "--heads", str(h), "--repeats", str(repeats), "--threads", str(threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    return json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)[0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default="build/attn", help="path of the attn executable")
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="BxTxHxHD,... (causal)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2, help="processes per side and shape; the best median counts")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--json-out", default="")
    p.add_argument("--worker", default="")
    p.add_argument("--shape", default="")
    args = p.parse_args()
    if args.worker:
        worker(args.worker, parse_shape(args.shape), args.repeats, args.threads)
        return 0

    header = (f"{'shape BxTxHxhd':>15} {'ggml f32':>9} {'ggml f16':>9} {'attn':>8} {'GFLOP/s ggml':>13} "
              f"{'GFLOP/s attn':>13} {'x vs f32':>9} {'x vs f16':>9}")
    print(f"forward, causal, {args.threads} threads; ms are medians of {args.repeats}, "
          f"the best of {args.rounds} processes per side")
    print(header)
    print("-" * len(header))
    rows = []
    for s in args.shapes.split(","):
        shape = parse_shape(s)
        def best(run):
            return min((run() for _ in range(args.rounds)), key=lambda r: r["ms_median"])

        g32 = best(lambda: run_ggml("f32", shape, args.repeats, args.threads))
        g16 = best(lambda: run_ggml("f16", shape, args.repeats, args.threads))
        a = best(lambda: run_attn(args.attn, shape, args.repeats, args.threads))
        fl = causal_flops(*shape)
        best_ggml = min(g32["ms_median"], g16["ms_median"])
        print(f"{s:>15} {g32['ms_median']:9.1f} {g16['ms_median']:9.1f} {a['ms_median']:8.1f} "
              f"{fl / best_ggml * 1e-6:13.1f} {fl / a['ms_median'] * 1e-6:13.1f} "
              f"{g32['ms_median'] / a['ms_median']:9.2f} {g16['ms_median'] / a['ms_median']:9.2f}", flush=True)
        rows.append({"shape": s, "ggml_f32": g32, "ggml_f16": g16, "attn": a, "useful_flops": fl})
    print("\nGFLOP/s ggml is its better of f32 and f16; x = ggml ms / attn ms. ggml's output was checked "
          "against numpy (causal, 2x70x3x64) before each timing.")
    if args.json_out:
        tmp = args.json_out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(tmp, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
