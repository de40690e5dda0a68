#!/usr/bin/env python3
"""Data-parallel training of GPT-2 on paper: tokens/s and scaling efficiency at
N ranks from a measured single-rank step, and ZeRO-1's optimizer memory.

    python3 bench/project_scaling.py --step-ms 5200 --tokens-per-step 512 \
        --measured-params 163009536 [--allreduce-json allreduce.json]
    python3 bench/project_scaling.py --metrics run/metrics.jsonl --measured-params 163009536

Pure standard library; prints Markdown tables (docs/distributed.md).

The model of a step (weak scaling: every rank keeps the measured tokens per
step, so N ranks process N times as many):

  compute   t_c = c * P * tokens, with c = t_measured / (P_measured * tokens_measured)
            (seconds per parameter per token, the 6 P FLOPs-per-token rule with the
            measured machine's rate); forward 1/3 of it, backward 2/3.
  gradients G = 4 P bytes (float32), summed by a ring allreduce over N ranks:
            t_ar = 2 (N - 1) / N * G / B + 2 (N - 1) * alpha
            (B the link's rate in bytes/s, alpha the per-message latency).
  no overlap:   t_step = t_c + t_ar
  overlap:      gradients leave in buckets of b bytes as backward makes them
                (PyTorch DDP's 25 MB): the link starts with the first bucket
                and the last bucket leaves when backward ends, so with
                f = min(1, b / G):
                t_step = t_fwd + max(t_bwd + f * t_ar, f * t_bwd + t_ar)
  tokens/s = N * tokens / t_step;  efficiency = t_c / t_step.

ZeRO stage 1 (--shard-optimizer): each rank keeps AdamW's two float32 moments
(8 bytes per parameter) for 1/N of the parameters, beside the whole float32
parameters and gradients (4 + 4 bytes): 8 P + 8 P / N bytes per rank against
16 P unsharded (activations not counted). The largest model a rank's memory M
holds: M / 16 unsharded, M / (8 + 8 / N) sharded.
"""
import argparse
import json
import statistics
import sys

GIB = 1024 ** 3


def gpt2_params(n_layers, emb_dim, vocab=50257, context=1024, tied=True, qkv_bias=True):
    """Parameters of a GPT-2 (OpenAI's layout: tied output head, qkv bias)."""
    d = emb_dim
    per_layer = (2 * d  # ln_1
                 + 3 * d * d + (3 * d if qkv_bias else 0)  # c_attn
                 + d * d + d  # c_proj
                 + 2 * d  # ln_2
                 + d * 4 * d + 4 * d + 4 * d * d + d)  # mlp
    total = vocab * d + context * d + n_layers * per_layer + 2 * d
    if not tied:
        total += vocab * d
    return total


MODELS = {
    "124M": gpt2_params(12, 768),   # 124,439,808
    "355M": gpt2_params(24, 1024),  # 354,823,168
}


def allreduce_seconds(params, ranks, link_bytes_per_s, latency_s=0.0):
    """Ring allreduce of float32 gradients: 2(N-1)/N x 4P bytes over the link."""
    if ranks <= 1:
        return 0.0
    grad_bytes = 4.0 * params
    return 2.0 * (ranks - 1) / ranks * grad_bytes / link_bytes_per_s + 2.0 * (ranks - 1) * latency_s


def step_seconds(compute_s, comm_s, overlap, grad_bytes, bucket_bytes):
    """One step's time from its compute and its allreduce (see the module doc)."""
    if not overlap:
        return compute_s + comm_s
    fwd, bwd = compute_s / 3.0, 2.0 * compute_s / 3.0
    f = min(1.0, bucket_bytes / grad_bytes) if grad_bytes > 0 else 1.0
    return fwd + max(bwd + f * comm_s, f * bwd + comm_s)


def zero1_bytes_per_rank(params, ranks, sharded):
    """float32 parameters + gradients + AdamW's two moments (sharded: 1/N of them)."""
    moments = 8.0 * params / (ranks if sharded else 1)
    return 4.0 * params + 4.0 * params + moments


def measured_from_metrics(path):
    """(step ms, tokens per step) from an attn train metrics.jsonl: the median
    of its ms_per_iter values, tokens per step from tokens_per_s."""
    ms, tokens = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            j = json.loads(line)
            if j.get("ms_per_iter") and j.get("tokens_per_s"):
                ms.append(float(j["ms_per_iter"]))
                tokens.append(float(j["tokens_per_s"]) * float(j["ms_per_iter"]) / 1000.0)
    if not ms:
        raise ValueError(f"{path}: no line with ms_per_iter and tokens_per_s")
    return statistics.median(ms), round(statistics.median(tokens))


def measured_busbw(path):
    """The best allreduce bus bandwidth (bytes/s) in a bench_allreduce JSON, and its N."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    rows = [r for r in j["results"] if r["op"] == "allreduce"]
    best = max(rows, key=lambda r: r["busbw_GBps"])
    return best["busbw_GBps"] * 1e9, j["ranks"], best["bytes"]


def fmt_rate(x):
    return f"{x:,.0f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step-ms", type=float, help="measured single-rank step time (ms)")
    p.add_argument("--metrics", help="or an attn train metrics.jsonl to read it from (median ms_per_iter)")
    p.add_argument("--tokens-per-step", type=int, help="tokens of the measured step (batch x context)")
    p.add_argument("--measured-params", type=float, required=True,
                   help="parameters of the measured model (attn train prints them)")
    p.add_argument("--tokens-per-rank", type=int,
                   help="tokens per rank per step in the projection (default: the measured step's)")
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512])
    p.add_argument("--links-gbit", type=float, nargs="+", default=[25.0, 100.0])
    p.add_argument("--latency-us", type=float, default=0.0, help="per-message latency alpha (default 0)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket (MB) for the overlap model")
    p.add_argument("--allreduce-json", help="bench_allreduce's JSON: adds its measured rate as a link")
    p.add_argument("--memory-gib", type=float, default=16.0, help="memory per rank for the ceiling line")
    a = p.parse_args(argv)

    if a.metrics:
        step_ms, tokens = measured_from_metrics(a.metrics)
        if a.tokens_per_step:
            tokens = a.tokens_per_step
    else:
        if a.step_ms is None or a.tokens_per_step is None:
            p.error("give --step-ms and --tokens-per-step, or --metrics")
        step_ms, tokens = a.step_ms, a.tokens_per_step
    if step_ms <= 0 or tokens <= 0 or a.measured_params <= 0:
        p.error("the step time, tokens and parameters must be > 0")
    per_rank = a.tokens_per_rank or tokens
    c = step_ms / 1000.0 / (a.measured_params * tokens)  # s per parameter per token

    links = [(f"{g:g} Gbit/s", g * 1e9 / 8.0) for g in a.links_gbit]
    if a.allreduce_json:
        bw, n, size = measured_busbw(a.allreduce_json)
        links.append((f"measured {bw / 1e9:.2f} GB/s (N={n}, {size >> 20} MiB)", bw))

    out = []
    out.append(f"Measured: {step_ms:.1f} ms per step of {tokens} tokens on a model of "
               f"{a.measured_params:,.0f} parameters = {c * 1e12:.3f} ps per parameter-token; "
               f"projected with {per_rank} tokens per rank per step, float32 gradients, ring "
               f"allreduce, latency {a.latency_us:g} us, buckets of {a.bucket_mb:g} MB.\n")
    out.append("| model | ranks | link | step (no overlap) | tokens/s | efficiency | "
               "step (overlap) | tokens/s | efficiency |")
    out.append("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for name, params in MODELS.items():
        compute = c * params * per_rank
        out.append(f"| {name} | 1 | - | {compute * 1e3:,.0f} ms | {fmt_rate(per_rank / compute)} | 100% "
                   f"| {compute * 1e3:,.0f} ms | {fmt_rate(per_rank / compute)} | 100% |")
        for link_name, bw in links:
            for n in a.ranks:
                comm = allreduce_seconds(params, n, bw, a.latency_us * 1e-6)
                cells = []
                for overlap in (False, True):
                    t = step_seconds(compute, comm, overlap, 4.0 * params, a.bucket_mb * 1e6)
                    cells += [f"{t * 1e3:,.0f} ms", fmt_rate(n * per_rank / t), f"{compute / t:.0%}"]
                out.append(f"| {name} | {n} | {link_name} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("ZeRO-1 memory per rank (float32 parameters + gradients + AdamW moments; activations "
               "not counted):\n")
    out.append("| model | ranks | unsharded | ZeRO-1 | saved |")
    out.append("|---|---:|---:|---:|---:|")
    for name, params in MODELS.items():
        for n in a.ranks:
            full = zero1_bytes_per_rank(params, n, False)
            shard = zero1_bytes_per_rank(params, n, True)
            out.append(f"| {name} | {n} | {full / GIB:.2f} GiB | {shard / GIB:.2f} GiB | "
                       f"{1 - shard / full:.0%} |")
    m = a.memory_gib * GIB
    ceil = ", ".join(f"{m / (8 + 8 / n) / 1e6:,.0f}M at N={n}" for n in a.ranks)
    out.append(f"\nThe memory ceiling at {a.memory_gib:g} GiB per rank (parameters, gradients and "
               f"moments only): {m / 16 / 1e6:,.0f}M parameters unsharded; with ZeRO-1 {ceil} "
               f"(at most 2x: the parameters and gradients stay whole).")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
