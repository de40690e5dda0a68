#!/usr/bin/env python3
"""GPT-2 124M generation, attn vs llama.cpp vs transformers, side by side in one run.

The shapes of issue 19: batch 1, a prompt of 64 token ids, 256 new tokens,
greedy; fp32 and bf16 (llama.cpp's f16 too); 2 threads and 1. Each side reports
prompt processing (prompt tokens / time of the prefill) and decoding (tokens
per second of one-token steps after the prompt), and each decoding rate is put
against this machine's memory read bandwidth: the weights a token reads
(every matrix of the 12 blocks and the 768 x 50,257 output head, once)
divided by the time per token, over `attn bench --bandwidth`'s rate with the
same thread count.

The three sides run the same random-weight Hugging Face checkpoint (none of it
is part of attn; docs/performance.md, "GPT-2 generation against llama.cpp and
transformers", says how it is made):
  attn          `attn generate --model HF_DIR --benchmark --json --prompt-tokens 64
                 --max-new-tokens 256 --dtype float32|bfloat16` (random prompt ids; the
                 decode rate is 255 steps / their time; bf16: bf16 KV cache and weights)
  llama.cpp     `llama-bench -m gpt2-random-{f32,bf16,f16}.gguf -t T -r 1 -o jsonl`:
                 `-p 64 -n 0` for the prompt, `-p 0 -n 256 -d 64` for decoding 256 tokens
                 after 64 in the cache (GGUFs from llama.cpp's convert_hf_to_gguf.py;
                 llama-bench warms up itself; its KV cache is f16)
  transformers  GPT2LMHeadModel.from_pretrained(HF_DIR, dtype=float32|bfloat16) on
                 PyTorch 2.x, torch.set_num_threads(T), under torch.inference_mode():
                 the prompt = one forward over the 64 ids with use_cache=True (timed after
                 a warm-up); decoding = model.generate(greedy, use_cache=True,
                 min_new_tokens = max_new_tokens = 256) with a streamer that stamps
                 the time of each new token: 255 tokens / (last stamp - first stamp)

Rounds: every (threads, dtype) case runs each side once per round, the order of
the sides rotated from round to round, each in a fresh process; the table
shows each side's median over the rounds (and the best decode rate). The
load average (/proc/loadavg, 1 minute) is recorded before every measurement:
the machine is shared, so only side-by-side ratios from one run mean much.

Threads wait passively by default (OMP_WAIT_POLICY=passive for all three: attn
and PyTorch on libgomp, llama.cpp built with OpenMP): on a shared, oversubscribed
machine a spinning thread that is descheduled at a barrier stalls its
partners for a time slice (llama-bench at 2 threads fell from ~58 to ~5 tok/s
that way). --spin leaves each side's default waiting.

    /work/venv-torch2/bin/python bench/compare_generate.py --attn build/attn \\
        --hf-dir /work/peers/gpt2-random --gguf-dir /work/peers \\
        --llama-bench /work/peers/llama.cpp/build/bin/llama-bench --rounds 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

E, LAYERS, VOCAB = 768, 12, 50257
# Weights a token reads: per block W_q, W_k, W_v, out_proj (4 E^2) and fc, proj (8 E^2); the head.
WEIGHTS = LAYERS * 12 * E * E + VOCAB * E
BYTES = {"fp32": 4, "bf16": 2, "f16": 2}


def cpu_name():
    model, family = "unknown CPU", "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("cpu family") and family == "?":
                family = line.split(":", 1)[1].strip()
    flags = open("/proc/cpuinfo").read()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    if "avx512_bf16" in flags:
        isa += " + AVX512-BF16"
    return f"{model} (family {family}), {os.cpu_count()} cores, {isa}"


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


# ---------------------------------------------------------------- transformers worker
def torch_worker(hf_dir, dtype, threads, prompt_tokens, new_tokens):
    import torch
    import transformers

    torch.set_num_threads(threads)
    tdtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    try:
        model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, dtype=tdtype)
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, torch_dtype=tdtype)
    model.eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, prompt_tokens), generator=g)

    class Stamps:
        """A streamer: generate() calls put() with the prompt, then with each new token."""

        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    kw = dict(do_sample=False, use_cache=True, pad_token_id=0, attention_mask=torch.ones_like(ids))
    with torch.inference_mode():
        model.generate(ids[:, :8], max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        model(ids, use_cache=True)
        t0 = time.perf_counter()
        model(ids, use_cache=True)
        t_prompt = time.perf_counter() - t0
        s = Stamps()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             streamer=s, **kw)
    assert out.shape[1] == prompt_tokens + new_tokens, out.shape
    stamps = s.times[1:]  # [0] is the prompt
    steps = len(stamps) - 1
    print(json.dumps({"prompt_tok_s": prompt_tokens / t_prompt,
                      "decode_tok_s": steps / (stamps[-1] - stamps[0]),
                      "torch": torch.__version__, "transformers": transformers.__version__}))


# ---------------------------------------------------------------- the sides
def run_json(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def side_attn(a, dtype, threads, env):
    d = run_json([a.attn, "generate", "--model", a.hf_dir, "--benchmark", "--json",
                  "--prompt-tokens", str(a.prompt), "--max-new-tokens", str(a.new),
                  "--dtype", {"fp32": "float32", "bf16": "bfloat16"}[dtype]], env)[0]
    return {"prompt_tok_s": d["prompt_tok_s_median"], "decode_tok_s": d["decode_tok_s_median"]}


def side_llama(a, dtype, threads, env):
    model = os.path.join(a.gguf_dir, f"gpt2-random-{dtype.replace('fp32', 'f32')}.gguf")
    base = [a.llama_bench, "-m", model, "-t", str(threads), "-r", "1", "-o", "jsonl"]
    if not a.spin:
        base += ["--poll", "0"]
    pp = run_json(base + ["-p", str(a.prompt), "-n", "0"], env)[0]
    tg = run_json(base + ["-p", "0", "-n", str(a.new), "-d", str(a.prompt)], env)[0]
    return {"prompt_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"],
            "build": f"{pp.get('build_commit')} ({pp.get('build_number')})"}


def side_torch(a, dtype, threads, env):
    return run_json([a.python, os.path.abspath(__file__), "--worker", "--hf-dir", a.hf_dir,
                     "--dtype", dtype, "--threads", str(threads), "--prompt", str(a.prompt),
                     "--new", str(a.new)], env)[0]


SIDES = {"attn": side_attn, "llama.cpp": side_llama, "transformers": side_torch}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default="build/attn")
    p.add_argument("--hf-dir", required=True, help="the Hugging Face GPT-2 directory")
    p.add_argument("--gguf-dir", help="where gpt2-random-{f32,bf16,f16}.gguf are")
    p.add_argument("--llama-bench", help="llama.cpp's llama-bench binary")
    p.add_argument("--python", default=sys.executable, help="the Python whose torch is timed")
    p.add_argument("--sides", default="attn,llama.cpp,transformers")
    p.add_argument("--dtypes", default="fp32,bf16,f16", help="f16: llama.cpp only")
    p.add_argument("--threads", default="2,1")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--spin", action="store_true", help="leave each side's thread waiting as is")
    p.add_argument("--json-out", help="write every measurement here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        torch_worker(a.hf_dir, a.dtype, int(a.threads), a.prompt, a.new)
        return

    sides = a.sides.split(",")
    threads_list = [int(t) for t in a.threads.split(",")]
    dtypes = a.dtypes.split(",")
    print(f"CPU: {cpu_name()}")
    print(f"batch 1, prompt {a.prompt} tokens, {a.new} new tokens, greedy; {a.rounds} rounds; "
          f"threads wait {'as each side does by default' if a.spin else 'passively'}")
    base_env = dict(os.environ)
    if not a.spin:
        base_env["OMP_WAIT_POLICY"] = "passive"

    def env_for(threads):
        e = dict(base_env)
        e["OMP_NUM_THREADS"] = str(threads)
        e["OPENBLAS_NUM_THREADS"] = "1"
        return e

    bw = {}
    for t in threads_list:
        d = run_json([a.attn, "bench", "--bandwidth", "--json", "--threads", str(t)], env_for(t))[0]
        bw[t] = d["read_gbs"][str(t)]
        print(f"memory read bandwidth, {t} thread{'s' if t > 1 else ''}: {bw[t]:.1f} GB/s "
              f"(attn bench --bandwidth, load {load1():.1f})")

    results = []  # dicts: side, dtype, threads, round, load, prompt_tok_s, decode_tok_s
    cases = [(t, d) for t in threads_list for d in dtypes]
    for rnd in range(a.rounds):
        for t, dtype in cases:
            order = sides[rnd % len(sides):] + sides[:rnd % len(sides)]
            for side in order:
                if dtype == "f16" and side != "llama.cpp":
                    continue
                load = load1()
                t0 = time.time()
                r = SIDES[side](a, dtype, t, env_for(t))
                r.update(side=side, dtype=dtype, threads=t, round=rnd, load=load)
                results.append(r)
                print(f"  round {rnd + 1} {side:<12} {dtype} {t}T: prompt "
                      f"{r['prompt_tok_s']:8.1f} tok/s, decode {r['decode_tok_s']:7.2f} tok/s "
                      f"(load {load:.1f}, {time.time() - t0:.0f} s)", flush=True)

    def med(side, t, dtype, key):
        v = [r[key] for r in results if r["side"] == side and r["threads"] == t and r["dtype"] == dtype]
        return (statistics.median(v), max(v)) if v else (None, None)

    print()
    print("| threads | dtype | side | prompt tok/s | decode tok/s (median) | best | "
          "decode / llama.cpp | decode / transformers | weights GB/s | of bandwidth | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for t in threads_list:
        for dtype in dtypes:
            ref_llama = med("llama.cpp", t, dtype, "decode_tok_s")[0]
            ref_torch = med("transformers", t, dtype, "decode_tok_s")[0]
            for side in sides:
                pp, _ = med(side, t, dtype, "prompt_tok_s")
                tg, best = med(side, t, dtype, "decode_tok_s")
                if tg is None:
                    continue
                load = statistics.median(r["load"] for r in results if r["side"] == side
                                         and r["threads"] == t and r["dtype"] == dtype)
                gbs = WEIGHTS * BYTES[dtype] * tg * 1e-9
                rl = f"{tg / ref_llama:.2f}" if ref_llama and side != "llama.cpp" else ""
                rt = f"{tg / ref_torch:.2f}" if ref_torch and side != "transformers" else ""
                print(f"| {t} | {dtype} | {side} | {pp:.1f} | {tg:.2f} | {best:.2f} | {rl} | {rt} | "
                      f"{gbs:.1f} | {gbs / bw[t]:.0%} | {load:.1f} |")
    print(f"\nweights per token: fp32 {WEIGHTS * 4 / 1e6:.1f} MB, bf16/f16 {WEIGHTS * 2 / 1e6:.1f} MB "
          f"({WEIGHTS:,} weights); 'of bandwidth' = weights GB/s / the read bandwidth above")
    extra = [r for r in results if r["side"] != "attn" and ("build" in r or "torch" in r)]
    for key, label in (("build", "llama.cpp build"), ("torch", "PyTorch"), ("transformers", "transformers")):
        vals = {r[key] for r in extra if key in r}
        if vals:
            print(f"{label}: {', '.join(sorted(vals))}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"cpu": cpu_name(), "bandwidth_gbs": bw, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
