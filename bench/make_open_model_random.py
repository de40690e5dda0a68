#!/usr/bin/env python3
"""Random-weight checkpoint with a published open model's shapes, for decode
benchmarks against llama.cpp and transformers (benchmarks only; no test uses it).

Families: qwen3 (Qwen3-0.6B), llama3 (Llama-3.2-1B), gemma3 (Gemma-3-270M).
Weights come from the model's own init (std 0.02) under torch.manual_seed(seed),
in float32, then cast to --dtype; DIR gets what save_pretrained writes and
nothing else (no tokenizer). Run with PyTorch 2.x and transformers 5.x:
    ~/venv-torch2/bin/python bench/make_open_model_random.py \
        --family qwen3 --dtype bfloat16 --out /tmp/qwen3-0.6b-bf16 [--seed 0]
"""
import argparse

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen3Config


def make_config(family):
    if family == "qwen3":  # Qwen/Qwen3-0.6B
        return Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
            max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            attention_bias=False, use_sliding_window=False, max_window_layers=28,
            bos_token_id=151643, eos_token_id=151645, initializer_range=0.02)
    if family == "llama3":  # meta-llama/Llama-3.2-1B
        return LlamaConfig(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64, hidden_act="silu",
            max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192},
            attention_bias=False, mlp_bias=False,
            bos_token_id=128000, eos_token_id=128001, initializer_range=0.02)
    if family == "gemma3":  # google/gemma-3-270m
        layers = 18
        return Gemma3TextConfig(
            vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=1, head_dim=256,
            hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256, sliding_window=512,
            layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                         for i in range(layers)],
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
            final_logit_softcapping=None, attn_logit_softcapping=None,
            pad_token_id=0, eos_token_id=1, bos_token_id=2, initializer_range=0.02)
    raise ValueError(family)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", required=True, choices=["qwen3", "llama3", "gemma3"])
    p.add_argument("--dtype", required=True, choices=["float32", "bfloat16"])
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    config = make_config(a.family)
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.to(getattr(torch, a.dtype)).eval()
    model.save_pretrained(a.out, safe_serialization=True)
    n = sum(t.numel() for t in model.parameters())
    print(f"{a.family}: {n} parameters, {a.dtype}, seed {a.seed} -> {a.out}")


if __name__ == "__main__":
    main()
