#!/usr/bin/env python3
"""The ctest `hf_gpt2_export_torch` (label torch): `attn export --format hf`
writes what GPT-2's layout means, checked with Debian's PyTorch 1.13 alone (no
transformers, no safetensors package).

For each fixture of tests/fixtures/hf_gpt2 (fp32, fp16, bf16, untied), attn
exports it in its own dtype; this script reads the written model.safetensors
with the independent numpy reader (safetensors_numpy.py), maps GPT-2's names
onto the book's GPTModel (book_gpt.py, qkv_bias=True) as the book's ch. 5
load_weights_into_gpt does (Conv1D weights transposed, c_attn split into
q, k, v, lm_head tied to wte unless stored), and compares the book model's
logits with transformers' logits in expected.json (made by
make_hf_gpt2_fixtures.py). Tolerance 1e-4; exits 1 on any difference.

    /usr/bin/python3 tests/torch/check_hf_gpt2_export.py --attn build/attn --out /tmp/x
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import book_gpt  # noqa: E402
import safetensors_numpy  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures", "hf_gpt2")
TOLERANCE = 1e-4


def as_float32(dtype, array):
    if dtype == "BF16":
        return torch.from_numpy((array.astype(np.uint32) << 16).view(np.float32).copy())
    return torch.from_numpy(array.astype(np.float32))


def book_model(directory):
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        hf = json.load(f)
    tensors, _, _, _, _ = safetensors_numpy.read(os.path.join(directory, "model.safetensors"))
    w = {k[len("transformer."):] if k.startswith("transformer.") else k: as_float32(*v)
         for k, v in tensors.items()}
    cfg = {"vocab_size": hf["vocab_size"], "context_length": hf["n_positions"], "emb_dim": hf["n_embd"],
           "n_heads": hf["n_head"], "n_layers": hf["n_layer"], "drop_rate": 0.0, "qkv_bias": True}
    m = book_gpt.GPTModel(cfg)
    E = cfg["emb_dim"]
    with torch.no_grad():
        m.tok_emb.weight.copy_(w["wte.weight"])
        m.pos_emb.weight.copy_(w["wpe.weight"])
        for i, b in enumerate(m.trf_blocks):
            h = f"h.{i}."
            q, k, v = torch.split(w[h + "attn.c_attn.weight"], E, dim=-1)
            b.att.W_query.weight.copy_(q.T)
            b.att.W_key.weight.copy_(k.T)
            b.att.W_value.weight.copy_(v.T)
            qb, kb, vb = torch.split(w[h + "attn.c_attn.bias"], E, dim=-1)
            b.att.W_query.bias.copy_(qb)
            b.att.W_key.bias.copy_(kb)
            b.att.W_value.bias.copy_(vb)
            b.att.out_proj.weight.copy_(w[h + "attn.c_proj.weight"].T)
            b.att.out_proj.bias.copy_(w[h + "attn.c_proj.bias"])
            b.ff.layers[0].weight.copy_(w[h + "mlp.c_fc.weight"].T)
            b.ff.layers[0].bias.copy_(w[h + "mlp.c_fc.bias"])
            b.ff.layers[2].weight.copy_(w[h + "mlp.c_proj.weight"].T)
            b.ff.layers[2].bias.copy_(w[h + "mlp.c_proj.bias"])
            b.norm1.scale.copy_(w[h + "ln_1.weight"])
            b.norm1.shift.copy_(w[h + "ln_1.bias"])
            b.norm2.scale.copy_(w[h + "ln_2.weight"])
            b.norm2.shift.copy_(w[h + "ln_2.bias"])
        m.final_norm.scale.copy_(w["ln_f.weight"])
        m.final_norm.shift.copy_(w["ln_f.bias"])
        tied = hf.get("tie_word_embeddings", True)
        if tied != ("lm_head.weight" not in w):
            raise SystemExit(f"{directory}: tie_word_embeddings is {tied} but lm_head.weight is "
                             f"{'present' if tied else 'absent'}")
        m.out_head.weight.copy_(w["wte.weight"] if tied else w["lm_head.weight"])
    m.eval()
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(os.path.join(FIXTURES, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)
    ids = torch.tensor([expected["ids"]])
    failures = 0
    for variant, dtype in [("fp32", "float32"), ("fp16", "float16"), ("bf16", "bfloat16"),
                           ("untied", "float32")]:
        out = os.path.join(args.out, variant)
        shutil.rmtree(out, ignore_errors=True)  # a fresh folder: export refuses to overwrite a model
        subprocess.run([args.attn, "export", "--model", os.path.join(FIXTURES, variant), "--format",
                        "hf", "--dtype", dtype, "--out", out], check=True, stdout=subprocess.DEVNULL)
        with torch.no_grad():
            logits = book_model(out)(ids)[0]
        diff = (logits - torch.tensor(expected["logits"][variant])).abs().max().item()
        ok = diff <= TOLERANCE
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {variant} exported as {dtype}: the book's GPTModel on the "
              f"written file vs transformers: max |logit difference| {diff:.3g} (allowed {TOLERANCE})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
