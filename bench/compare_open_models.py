#!/usr/bin/env python3
"""attn beside llama.cpp (and transformers) on Llama 3 / Qwen3 / Gemma 3 checkpoints:
prompt processing and decoding, tokens/s, in one run (docs/performance.md, "Open models
against llama.cpp and transformers").

Each model is given as HF_DIR=GGUF: a Hugging Face directory (what
bench/make_open_model_random.py writes) and the same checkpoint converted by
llama.cpp's convert_hf_to_gguf.py (--outtype f32 or bf16, matching the
directory's dtype). For each model and thread count:

  attn         attn generate --model HF_DIR --benchmark --json --dtype D
               (--repeats R: an empty cache, the prompt, then N greedy steps)
  llama.cpp    llama-bench -m GGUF -t T -r R -p P -n 0            (prompt)
               llama-bench -m GGUF -t T -r R -p 0 -n N -d P       (decoding after P tokens)
  transformers (--transformers) the model in D on PyTorch 2.x: one forward over
               the prompt with its KV cache, then N greedy steps of one token

Medians of R runs; the ratios are attn / other. The runs alternate which
engine goes first. Run on a quiet machine, e.g.

    ~/venv-torch2/bin/python bench/compare_open_models.py --attn build/attn \\
        --llama-bench ~/llama.cpp/build/bin/llama-bench \\
        --model qwen3-0.6b-f32=qwen3-0.6b-f32.gguf --model qwen3-0.6b-bf16=qwen3-0.6b-bf16.gguf
"""
import argparse
import json
import os
import statistics
import subprocess
import time


def dtype_of(hf_dir):
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    d = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return "bfloat16" if d == "bfloat16" else "float32"


def run_attn(attn, hf_dir, dtype, threads, prompt, new, repeats):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([attn, "generate", "--model", hf_dir, "--benchmark", "--json", "--dtype", dtype,
                          "--prompt-tokens", str(prompt), "--max-new-tokens", str(new),
                          "--repeats", str(repeats)], env=env, check=True, capture_output=True, text=True)
    j = json.loads(out.stdout)
    return j["prompt_median"], j["decode_median"]


def run_llama(bench, gguf, threads, prompt, new, repeats):
    def one(args):
        out = subprocess.run([bench, "-m", gguf, "-t", str(threads), "-r", str(repeats), "-o", "json"] + args,
                             check=True, capture_output=True, text=True)
        return statistics.median(json.loads(out.stdout)[0]["samples_ts"]), json.loads(out.stdout)[0]
    pp, info = one(["-p", str(prompt), "-n", "0"])
    tg, _ = one(["-p", "0", "-n", str(new), "-d", str(prompt)])
    return pp, tg, info


def run_transformers(hf_dir, dtype, threads, prompt, new, repeats):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=gen)
    pps, tgs = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            pps.append(prompt / (time.perf_counter() - t0))
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            t0 = time.perf_counter()
            for _ in range(new):
                out = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            tgs.append(new / (time.perf_counter() - t0))
    return statistics.median(pps), statistics.median(tgs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attn", default="build/attn")
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--model", action="append", required=True, metavar="HF_DIR=GGUF")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--transformers", action="store_true")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    rows = []
    flip = False
    print(f"prompt {a.prompt} tokens, then {a.new} decoded; medians of {a.repeats}; tokens/s")
    print("| model | dtype | threads | attn prompt | llama.cpp prompt | ratio | attn decode | "
          "llama.cpp decode | ratio |" + (" transformers prompt | decode | decode ratio |" if a.transformers else ""))
    for spec in a.model:
        hf_dir, gguf = spec.split("=", 1)
        dtype = dtype_of(hf_dir)
        for t in [int(x) for x in a.threads.split(",")]:
            if flip:
                pp_l, tg_l, info = run_llama(a.llama_bench, gguf, t, a.prompt, a.new, a.repeats)
                pp_a, tg_a = run_attn(a.attn, hf_dir, dtype, t, a.prompt, a.new, a.repeats)
            else:
                pp_a, tg_a = run_attn(a.attn, hf_dir, dtype, t, a.prompt, a.new, a.repeats)
                pp_l, tg_l, info = run_llama(a.llama_bench, gguf, t, a.prompt, a.new, a.repeats)
            flip = not flip
            row = {"model": os.path.basename(hf_dir.rstrip("/")), "dtype": dtype, "threads": t,
                   "attn_prompt": pp_a, "llama_prompt": pp_l, "attn_decode": tg_a, "llama_decode": tg_l,
                   "llama_build": info.get("build_commit"), "llama_kv": f'{info.get("type_k")}/{info.get("type_v")}',
                   "llama_flash_attn": info.get("flash_attn")}
            line = (f'| {row["model"]} | {dtype} | {t} | {pp_a:.1f} | {pp_l:.1f} | {pp_a / pp_l:.2f} | '
                    f'{tg_a:.2f} | {tg_l:.2f} | {tg_a / tg_l:.2f} |')
            if a.transformers:
                pp_t, tg_t = run_transformers(hf_dir, dtype, t, a.prompt, a.new, a.repeats)
                row.update(transformers_prompt=pp_t, transformers_decode=tg_t)
                line += f" {pp_t:.1f} | {tg_t:.2f} | {tg_a / tg_t:.2f} |"
            print(line, flush=True)
            rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
