"""The walkthrough (`attn walkthrough`) written as the chapter's own PyTorch code.

Every tensor the C++ walkthrough prints is recorded here under the same section
and name, in the same order, with torch's str() of it (the text PyTorch prints)
and its values. tests/torch/test_walkthrough_torch.cpp compares the two.

Each section starts from a fresh manual_seed where the SPEC names one and
recomputes what it needs from earlier sections (the causal section rebuilds the
seed-789 SelfAttention_v2), so a section can run on its own, as
`attn walkthrough --section causal` does. `seed` overrides every seed, as
`attn walkthrough --seed N` does.

Files written (into out_dir):
  walkthrough.json           the SPEC's seeds
  walkthrough_seed7.json     every seed replaced by 7
Each is {"seed": null | N, "tensors": [{"section", "name", "shape", "values", "text"}]};
non-finite values are the strings "inf", "-inf", "nan" (JSON has no such numbers).
"""
import math
import pathlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from book_modules import (CausalAttention, MultiHeadAttention, MultiHeadAttentionWrapper,
                          SelfAttention_v1, SelfAttention_v2)
from oracle_util import write_json

SECTIONS = ["simplified", "trainable", "self-attention", "causal", "dropout",
            "multihead", "averaging", "embedding"]


class Recorder:
    def __init__(self):
        self.section = ""
        self.tensors = []

    def __call__(self, name, t):
        t = t.detach().to(torch.float32).contiguous()
        values = []
        for v in t.reshape(-1).tolist():
            if math.isnan(v):
                values.append("nan")
            elif math.isinf(v):
                values.append("inf" if v > 0 else "-inf")
            else:
                values.append(v)
        self.tensors.append({"section": self.section, "name": name,
                             "shape": list(t.shape), "values": values, "text": str(t)})


class Seeds:
    """torch.manual_seed(s), or the override when one is given."""

    def __init__(self, override):
        self.override = override

    def __call__(self, s):
        torch.manual_seed(s if self.override is None else self.override)


def example_inputs():
    return torch.tensor(
        [[0.43, 0.15, 0.89],  # Your     (x^1)
         [0.55, 0.87, 0.66],  # journey  (x^2)
         [0.57, 0.85, 0.64],  # starts   (x^3)
         [0.22, 0.58, 0.33],  # with     (x^4)
         [0.77, 0.25, 0.10],  # one      (x^5)
         [0.05, 0.80, 0.55]]  # step     (x^6)
    )


# ---- the chapter's classes: tests/torch/book_modules.py ------------------------------

# ---- the eight worked examples -----------------------------------------------------

def simplified(rec, seed):
    inputs = example_inputs()
    rec("inputs", inputs)
    query = inputs[1]  # "journey"
    attn_scores_2 = torch.empty(inputs.shape[0])
    for i, x_i in enumerate(inputs):
        attn_scores_2[i] = torch.dot(x_i, query)
    rec("attn_scores_2", attn_scores_2)
    attn_weights_2_tmp = attn_scores_2 / attn_scores_2.sum()
    rec("attn_weights_2_tmp", attn_weights_2_tmp)
    rec("attn_weights_2_tmp.sum()", attn_weights_2_tmp.sum())

    def softmax_naive(x):
        return torch.exp(x) / torch.exp(x).sum(dim=0)
    attn_weights_2_naive = softmax_naive(attn_scores_2)
    rec("attn_weights_2_naive", attn_weights_2_naive)
    attn_weights_2 = torch.softmax(attn_scores_2, dim=0)
    rec("attn_weights_2", attn_weights_2)
    rec("attn_weights_2.sum()", attn_weights_2.sum())
    context_vec_2 = torch.zeros(query.shape)
    for i, x_i in enumerate(inputs):
        context_vec_2 += attn_weights_2[i] * x_i
    rec("context_vec_2", context_vec_2)

    attn_scores = torch.empty(6, 6)
    for i, x_i in enumerate(inputs):
        for j, x_j in enumerate(inputs):
            attn_scores[i, j] = torch.dot(x_i, x_j)
    rec("attn_scores_loops", attn_scores)
    attn_scores = inputs @ inputs.T
    rec("attn_scores", attn_scores)
    attn_weights = torch.softmax(attn_scores, dim=-1)
    rec("attn_weights", attn_weights)
    rec("attn_weights.sum(dim=-1)", attn_weights.sum(dim=-1))
    all_context_vecs = attn_weights @ inputs
    rec("all_context_vecs", all_context_vecs)


def trainable(rec, seed):
    inputs = example_inputs()
    x_2 = inputs[1]
    d_in = inputs.shape[1]
    d_out = 2
    seed(123)
    W_query = nn.Parameter(torch.rand(d_in, d_out), requires_grad=False)
    W_key = nn.Parameter(torch.rand(d_in, d_out), requires_grad=False)
    W_value = nn.Parameter(torch.rand(d_in, d_out), requires_grad=False)
    rec("W_query", W_query)
    rec("W_key", W_key)
    rec("W_value", W_value)
    query_2 = x_2 @ W_query
    rec("query_2", query_2)
    keys = inputs @ W_key
    values = inputs @ W_value
    rec("keys", keys)
    rec("values", values)
    keys_2 = keys[1]
    attn_score_22 = query_2.dot(keys_2)
    rec("attn_score_22", attn_score_22)
    attn_scores_2 = query_2 @ keys.T
    rec("attn_scores_2", attn_scores_2)
    d_k = keys.shape[-1]
    attn_weights_2 = torch.softmax(attn_scores_2 / d_k**0.5, dim=-1)
    rec("attn_weights_2", attn_weights_2)
    context_vec_2 = attn_weights_2 @ values
    rec("context_vec_2", context_vec_2)


def self_attention(rec, seed):
    inputs = example_inputs()
    seed(123)
    sa_v1 = SelfAttention_v1(3, 2)
    rec("sa_v1(inputs)", sa_v1(inputs))
    seed(789)
    sa_v2 = SelfAttention_v2(3, 2)
    rec("sa_v2(inputs)", sa_v2(inputs))


def causal_weights(rec, seed):
    """Step 4 on the seed-789 SelfAttention_v2; returns the masked-softmax weights."""
    inputs = example_inputs()
    seed(789)
    sa_v2 = SelfAttention_v2(3, 2)
    queries = sa_v2.W_query(inputs)
    keys = sa_v2.W_key(inputs)
    attn_scores = queries @ keys.T
    attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
    rec("attn_weights", attn_weights)
    context_length = attn_scores.shape[0]
    mask_simple = torch.tril(torch.ones(context_length, context_length))
    rec("mask_simple", mask_simple)
    masked_simple = attn_weights * mask_simple
    rec("masked_simple", masked_simple)
    row_sums = masked_simple.sum(dim=-1, keepdim=True)
    masked_simple_norm = masked_simple / row_sums
    rec("masked_simple_norm", masked_simple_norm)
    mask = torch.triu(torch.ones(context_length, context_length), diagonal=1)
    masked = attn_scores.masked_fill(mask.bool(), -torch.inf)
    rec("masked", masked)
    attn_weights = torch.softmax(masked / keys.shape[-1]**0.5, dim=1)
    rec("attn_weights_causal", attn_weights)
    return attn_weights


def causal(rec, seed):
    causal_weights(rec, seed)


def dropout_section(rec, seed):
    attn_weights = causal_weights(lambda name, t: None, seed)  # computed, not printed again
    seed(123)
    dropout = torch.nn.Dropout(0.5)
    example = torch.ones(6, 6)
    rec("dropout(example)", dropout(example))
    seed(123)
    rec("dropout(attn_weights)", dropout(attn_weights))


def multihead(rec, seed):
    inputs = example_inputs()
    batch = torch.stack((inputs, inputs), dim=0)
    rec("batch", batch)
    context_length = batch.shape[1]
    d_in, d_out = 3, 2
    seed(123)
    ca = CausalAttention(d_in, d_out, context_length, 0.0)
    rec("ca(batch)", ca(batch))
    seed(123)
    mha_wrapper = MultiHeadAttentionWrapper(d_in, d_out, context_length, 0.0, num_heads=2)
    rec("mha_wrapper(batch)", mha_wrapper(batch))
    seed(123)
    mha = MultiHeadAttention(d_in, d_out, context_length, 0.0, num_heads=2)
    rec("mha(batch)", mha(batch))


def averaging(rec, seed):
    seed(1337)
    B, T, C = 4, 8, 2
    x = torch.randn(B, T, C)
    rec("x[0]", x[0])
    xbow = torch.zeros((B, T, C))
    for b in range(B):
        for t in range(T):
            xprev = x[b, :t + 1]  # (t, C)
            xbow[b, t] = torch.mean(xprev, 0)
    rec("xbow[0]", xbow[0])
    wei = torch.tril(torch.ones(T, T))
    wei = wei / wei.sum(1, keepdim=True)
    rec("wei", wei)
    xbow2 = wei @ x  # (T, T) @ (B, T, C) -> (B, T, C)
    rec("xbow2[0]", xbow2[0])
    tril = torch.tril(torch.ones(T, T))
    wei = torch.zeros((T, T))
    wei = wei.masked_fill(tril == 0, float('-inf'))
    wei = F.softmax(wei, dim=-1)
    xbow3 = wei @ x
    rec("xbow3[0]", xbow3[0])

    # a single head of self-attention
    seed(1337)
    B, T, C = 4, 8, 32
    x = torch.randn(B, T, C)
    head_size = 16
    key = nn.Linear(C, head_size, bias=False)
    query = nn.Linear(C, head_size, bias=False)
    value = nn.Linear(C, head_size, bias=False)
    k = key(x)    # (B, T, 16)
    q = query(x)  # (B, T, 16)
    wei = q @ k.transpose(-2, -1) * head_size**-0.5  # (B, T, 16) @ (B, 16, T) -> (B, T, T)
    tril = torch.tril(torch.ones(T, T))
    wei = wei.masked_fill(tril == 0, float('-inf'))
    wei = F.softmax(wei, dim=-1)
    rec("wei[0]", wei[0])
    v = value(x)
    out = wei @ v
    rec("out[0]", out[0])


def embedding(rec, seed):
    sentence = 'Life is short, eat dessert first'
    dc = {s: i for i, s in enumerate(sorted(sentence.replace(',', '').split()))}
    sentence_int = torch.tensor([dc[s] for s in sentence.replace(',', '').split()])
    seed(123)
    embed = torch.nn.Embedding(6, 16)
    embedded_sentence = embed(sentence_int).detach()
    rec("embedded_sentence", embedded_sentence)
    seed(123)
    d = embedded_sentence.shape[1]
    d_q, d_k, d_v = 24, 24, 28
    W_query = torch.nn.Parameter(torch.rand(d_q, d))
    W_key = torch.nn.Parameter(torch.rand(d_k, d))
    W_value = torch.nn.Parameter(torch.rand(d_v, d))
    x_2 = embedded_sentence[1]
    query_2 = W_query.matmul(x_2)
    rec("query_2", query_2)
    keys = W_key.matmul(embedded_sentence.T).T
    rec("keys", keys)
    values = W_value.matmul(embedded_sentence.T).T
    omega_24 = query_2.dot(keys[4])
    rec("omega_24", omega_24)
    omega_2 = query_2.matmul(keys.T)
    rec("omega_2", omega_2)
    attention_weights_2 = F.softmax(omega_2 / d_k**0.5, dim=0)
    rec("attention_weights_2", attention_weights_2)
    context_vector_2 = attention_weights_2.matmul(values)
    rec("context_vector_2", context_vector_2)


RUN = {"simplified": simplified, "trainable": trainable, "self-attention": self_attention,
       "causal": causal, "dropout": dropout_section, "multihead": multihead,
       "averaging": averaging, "embedding": embedding}


def walkthrough(seed_override=None, sections=SECTIONS):
    rec = Recorder()
    seed = Seeds(seed_override)
    for name in sections:
        rec.section = name
        with torch.no_grad():
            RUN[name](rec, seed)
    return {"seed": seed_override, "tensors": rec.tensors}


def generate(out_dir):
    out_dir = pathlib.Path(out_dir)
    write_json(out_dir / "walkthrough.json", walkthrough())
    write_json(out_dir / "walkthrough_seed7.json", walkthrough(seed_override=7))


if __name__ == "__main__":
    import sys
    for t in walkthrough(int(sys.argv[1]) if len(sys.argv) > 1 else None)["tensors"]:
        print(f"[{t['section']}] {t['name']}  shape {tuple(t['shape'])}")
        print(t["text"])
        print()
