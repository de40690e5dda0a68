"""The book's GPT with rotary position embedding (GPTConfig::rope, attn/gpt.h)
and with multi-head latent attention (GPTConfig::latent_dim, the book's
ch04/05_mla GPT) under PyTorch 1.13: training losses and greedy generation.

The model is the book's chapter-4 GPTModel (book_gpt.py) changed as the book's
Llama chapter changes it, in our own words: no pos_emb (so the generator's
draws go tok_emb, drop_emb, the blocks, final_norm, out_head), and in every
attention layer q and k rotated after their projections:

  theta_i = theta_base^(-2i/hd) (float32), angle[p, i] = p * theta_i,
  cos/sin tables with each row's angles repeated for the second half;
  x = (x1, x2) at position p -> (x1 cos - x2 sin, x2 cos + x1 sin).

Recorded: 8 AdamW steps (nanoGPT's cosine schedule, gradient clipping) of a
small model from manual_seed(123) on random next-token batches, at drop_rate 0
and 0.1 (PyTorch's dropout masks, drawn in the book's order), with each step's
loss and gradient norm and the final parameters; then, from the trained
drop_rate-0 model in eval mode, 14 greedy tokens after a 3-token prompt (past
context_length 12: the window slides and its positions restart at 0),
recomputing the whole (cropped) sequence every step (no cache).

The latent-attention GPT (also in our own words): the book's GPTModel (with
pos_emb) whose blocks' att is multi-head latent attention: q = x Wq^T, a latent
c = x Wdkv^T of latent_dim values, k = c Wuk^T, v = c Wuv^T, causal attention per
head, out_proj (the parameters created in that order, before the block's ff);
8 AdamW steps at drop_rate 0, and 14 greedy tokens as above.

Writes gpt_rope.json.
"""
import pathlib
import random

import torch
import torch.nn.functional as F

import book_gpt as bg
from book_modules import MultiHeadAttention
from oracle_util import tensor_json, write_json

CFG = {"vocab_size": 40, "context_length": 12, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
       "drop_rate": 0.0, "qkv_bias": False, "rope": True, "theta_base": 10000.0}
HP = {"steps": 8, "batch": 3, "tokens": 12, "learning_rate": 3e-3, "min_lr": 3e-4,
      "warmup_iters": 2, "lr_decay_iters": 7, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
      "weight_decay": 0.1, "max_norm": 1.0}


def rope_tables(hd, base, n):
    theta = 1.0 / base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    angle = torch.arange(n, dtype=torch.float32)[:, None] * theta[None, :]
    return torch.cat([angle.cos()] * 2, dim=1), torch.cat([angle.sin()] * 2, dim=1)


def rotate(x, cos, sin):
    T, h = x.shape[2], x.shape[3] // 2
    c, s = cos[:T], sin[:T]
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * c[:, :h] - x2 * s[:, :h], x2 * c[:, h:] + x1 * s[:, h:]], dim=-1)


class RopeAttention(MultiHeadAttention):
    def forward(self, x):
        b, T, _ = x.shape
        heads = lambda t: t.view(b, T, self.num_heads, self.head_dim).transpose(1, 2)
        q, k, v = heads(self.W_query(x)), heads(self.W_key(x)), heads(self.W_value(x))
        q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        s = (q @ k.transpose(2, 3)).masked_fill(self.mask.bool()[:T, :T], -torch.inf)
        w = self.dropout(torch.softmax(s / self.head_dim ** 0.5, dim=-1))
        return self.out_proj((w @ v).transpose(1, 2).reshape(b, T, self.d_out))


class RopeGPT(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.drop_emb = torch.nn.Dropout(cfg["drop_rate"])
        blocks = []
        for _ in range(cfg["n_layers"]):
            block = bg.TransformerBlock(cfg)  # its att is replaced before any draw of the next
            blocks.append(block)
        self.trf_blocks = torch.nn.Sequential(*blocks)
        self.final_norm = bg.LayerNorm(cfg["emb_dim"])
        self.out_head = torch.nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)
        cos, sin = rope_tables(cfg["emb_dim"] // cfg["n_heads"], cfg["theta_base"],
                               cfg["context_length"])
        for block in self.trf_blocks:
            block.att.__class__ = RopeAttention  # same parameters, the rotation added
            block.att.cos, block.att.sin = cos, sin

    def forward(self, idx):
        x = self.drop_emb(self.tok_emb(idx))
        return self.out_head(self.final_norm(self.trf_blocks(x)))


class LatentAttention(torch.nn.Module):
    def __init__(self, d, heads, latent, bias):
        super().__init__()
        self.h = heads
        self.W_query = torch.nn.Linear(d, d, bias=bias)
        self.W_DKV = torch.nn.Linear(d, latent, bias=bias)
        self.W_UK = torch.nn.Linear(latent, d, bias=bias)
        self.W_UV = torch.nn.Linear(latent, d, bias=bias)
        self.out_proj = torch.nn.Linear(d, d)

    def forward(self, x):
        b, T, d = x.shape
        heads = lambda t: t.view(b, T, self.h, d // self.h).transpose(1, 2)
        c = self.W_DKV(x)
        q, k, v = heads(self.W_query(x)), heads(self.W_UK(c)), heads(self.W_UV(c))
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        s = (q @ k.transpose(2, 3)).masked_fill(future, -torch.inf)
        w = torch.softmax(s / (d // self.h) ** 0.5, dim=-1)
        return self.out_proj((w @ v).transpose(1, 2).reshape(b, T, d))


class LatentBlock(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.att = LatentAttention(cfg["emb_dim"], cfg["n_heads"], cfg["latent_dim"],
                                   cfg["qkv_bias"])
        self.ff = bg.FeedForward(cfg)
        self.norm1 = bg.LayerNorm(cfg["emb_dim"])
        self.norm2 = bg.LayerNorm(cfg["emb_dim"])
        self.drop_shortcut = torch.nn.Dropout(cfg["drop_rate"])

    def forward(self, x):
        x = x + self.drop_shortcut(self.att(self.norm1(x)))
        return x + self.drop_shortcut(self.ff(self.norm2(x)))


class LatentGPT(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = torch.nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.drop_emb = torch.nn.Dropout(cfg["drop_rate"])
        self.trf_blocks = torch.nn.Sequential(*[LatentBlock(cfg) for _ in range(cfg["n_layers"])])
        self.final_norm = bg.LayerNorm(cfg["emb_dim"])
        self.out_head = torch.nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
        return self.out_head(self.final_norm(self.trf_blocks(self.drop_emb(x))))


def get_lr(it, hp):
    import math
    if it < hp["warmup_iters"]:
        return hp["learning_rate"] * (it + 1) / (hp["warmup_iters"] + 1)
    if it > hp["lr_decay_iters"]:
        return hp["min_lr"]
    ratio = (it - hp["warmup_iters"]) / (hp["lr_decay_iters"] - hp["warmup_iters"])
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return hp["min_lr"] + coeff * (hp["learning_rate"] - hp["min_lr"])


def train(drop_rate, rng, cfg=None, make=None):
    cfg = dict(cfg or CFG, drop_rate=drop_rate)
    make = make or RopeGPT
    text = [rng.randrange(cfg["vocab_size"]) for _ in range(40)]
    batches = []
    for _ in range(HP["steps"]):
        starts = [rng.randrange(len(text) - HP["tokens"]) for _ in range(HP["batch"])]
        batches.append(([text[s + i] for s in starts for i in range(HP["tokens"])],
                        [text[s + i + 1] for s in starts for i in range(HP["tokens"])]))
    torch.manual_seed(123)
    model = make(cfg)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HP["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=HP["learning_rate"], betas=(HP["beta1"], HP["beta2"]),
                            eps=HP["eps"], foreach=False)
    steps = []
    for it, (x, y) in enumerate(batches):
        lr = get_lr(it, HP)
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(torch.tensor(x).view(HP["batch"], HP["tokens"]))
        loss = F.cross_entropy(logits.flatten(0, 1), torch.tensor(y))
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), HP["max_norm"])
        opt.step()
        steps.append({"lr": lr, "loss": float(loss), "grad_norm": float(norm)})
    out = {"config": cfg, "seed": 123, "hp": HP, "batches": batches, "steps": steps,
           "state_dict_keys": list(model.state_dict().keys()),
           "final_params": {n: tensor_json(p) for n, p in model.named_parameters()}}
    return out, model


def greedy(model, prompt, n, context):
    model.eval()
    idx = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            logits = model(idx[:, -context:])[:, -1]
            idx = torch.cat([idx, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return idx[0].tolist()


def generate(out_dir):
    rng = random.Random(31)
    run0, model = train(0.0, rng)
    run1, _ = train(0.1, rng)
    prompt = [3, 17, 5]
    run0["greedy"] = {"prompt": prompt, "tokens": greedy(model, prompt, 14, CFG["context_length"])}
    mla_cfg = dict(CFG, rope=False, latent_dim=6, qkv_bias=True)
    run2, mla = train(0.0, rng, mla_cfg, LatentGPT)
    run2["greedy"] = {"prompt": prompt, "tokens": greedy(mla, prompt, 14, CFG["context_length"])}
    write_json(pathlib.Path(out_dir) / "gpt_rope.json", {"train": [run0, run1, run2]})
