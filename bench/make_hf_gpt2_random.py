#!/usr/bin/env python3
"""A random-weight Hugging Face GPT-2 124M checkpoint for bench/compare_generate.py.

    /work/venv-torch2/bin/python bench/make_hf_gpt2_random.py --out /work/peers/gpt2-random

GPT2LMHeadModel(GPT2Config()) under torch.manual_seed(0) (124,439,808
parameters, lm_head tied to wte), saved with save_pretrained (config.json +
model.safetensors, float32), plus GPT-2's tokenizer files from data/gpt2
(vocab.json = encoder.json, merges.txt = vocab.bpe) so that llama.cpp's
convert_hf_to_gguf.py recognises the tokenizer, and "n_ctx" in config.json
(transformers 5 no longer writes it; the converter reads it).
"""
import argparse
import json
import os
import shutil

import torch
import transformers


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    data = os.path.join(here, "..", "data", "gpt2")
    torch.manual_seed(a.seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    model.eval()
    model.save_pretrained(a.out)
    shutil.copy(os.path.join(data, "encoder.json"), os.path.join(a.out, "vocab.json"))
    shutil.copy(os.path.join(data, "vocab.bpe"), os.path.join(a.out, "merges.txt"))
    path = os.path.join(a.out, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.setdefault("n_ctx", cfg["n_positions"])
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"wrote {a.out}: {sum(q.numel() for q in model.parameters()):,} parameters")


if __name__ == "__main__":
    main()
