"""Oracle for the chapter-4 GPT (tests/torch/book_gpt.py) under PyTorch 1.13:
the reference values tests/torch/test_gpt_torch.cpp compares attn's model with.

Writes gpt.json with:
  init         the parameters of a small GPTModel after torch.manual_seed(123),
               as float32 bit patterns (attn must reproduce them bit for bit),
               and the state_dict keys in order
  init_124m    GPT_CONFIG_124M after manual_seed(123): parameter count, the
               CRC-32 of every parameter's float32 bytes, and the eval-mode
               logits of one 8-token sequence (every 97th value)
  forward      small GPT, train mode, one fixed batch: logits, cross-entropy
               loss and every parameter gradient; once with drop_rate 0 and
               once with drop_rate 0.1 (the dropout masks come from the same
               MT19937 stream attn's reference path follows)
  layers       LayerNorm, GELU, FeedForward, TransformerBlock (with and without
               dropout), cross-entropy, RMSNorm (Llama's and Gemma's) and the
               gated feed-forward (SwiGLU, GeGLU), the maths in our words: the
               bonus chapters' open models: inputs,
               output, input and parameter gradients
  optim        clip_grad_norm_ and one AdamW tensor stepped 5 times
  schedule     nanoGPT's get_lr (warm-up + cosine) for every iteration
  train        10 AdamW steps of a small GPT (decay on 2-D parameters only,
               clip_grad_norm_ 1.0, the warm-up + cosine schedule), drop_rate 0
               and 0.1: per step the lr, loss and gradient norm, and the final
               parameters of the drop_rate-0 run

torch's randn (numel >= 16) depends on the CPU kernel it dispatches to; attn
follows the AVX2 one, so, as oracle_modules.py does, this script reruns itself
with ATEN_CPU_CAPABILITY=avx2 when torch picked another.
"""
import math
import pathlib
import random
import sys
import zlib

import torch
import torch.nn.functional as F

import book_gpt as bg
from oracle_util import cpu_capability, run_under_avx2, tensor_bits_json, tensor_json, write_json

SMALL = {"vocab_size": 64, "context_length": 16, "emb_dim": 32, "n_heads": 4,
         "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}

TRAIN = {"steps": 10, "batch": 4, "tokens": 16, "learning_rate": 3e-3, "min_lr": 3e-4,
         "warmup_iters": 3, "lr_decay_iters": 8, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
         "weight_decay": 0.1, "max_norm": 0.5}


def get_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """nanoGPT's train.py get_lr."""
    # 1) linear warmup for warmup_iters steps
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    # 2) if it > lr_decay_iters, return min learning rate
    if it > lr_decay_iters:
        return min_lr
    # 3) in between, use cosine decay down to min learning rate
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # coeff ranges 0..1
    return min_lr + coeff * (learning_rate - min_lr)


def ids(rng: random.Random, shape, vocab) -> list:
    n = 1
    for s in shape:
        n *= s
    return [rng.randrange(vocab) for _ in range(n)]


def grads_json(model) -> dict:
    return {n: tensor_json(p.grad) for n, p in model.named_parameters()}


def gen_init() -> dict:
    torch.manual_seed(123)
    model = bg.GPTModel(SMALL)
    return {"config": SMALL, "seed": 123,
            "params": {n: tensor_bits_json(p) for n, p in model.named_parameters()},
            "state_dict_keys": list(model.state_dict().keys())}


def gen_init_124m() -> dict:
    cfg = bg.GPT_CONFIG_124M
    torch.manual_seed(123)
    model = bg.GPTModel(cfg)
    crc = {n: zlib.crc32(p.detach().contiguous().numpy().tobytes()) for n, p in model.named_parameters()}
    model.eval()
    tokens = ids(random.Random(124), [1, 8], cfg["vocab_size"])
    with torch.no_grad():
        logits = model(torch.tensor(tokens).view(1, 8))
    flat = logits.reshape(-1)
    return {"config": cfg, "seed": 123, "num_params": sum(p.numel() for p in model.parameters()),
            "crc32": crc, "ids": tokens, "logits_shape": list(logits.shape), "stride": 97,
            "logits_sampled": [float(v) for v in flat[::97].tolist()],
            "logits_max_abs": float(flat.abs().max())}


def gen_forward(drop_rate: float) -> dict:
    cfg = dict(SMALL, drop_rate=drop_rate)
    rng = random.Random(7)
    B, T = 2, 12
    x = ids(rng, [B, T], cfg["vocab_size"])
    y = ids(rng, [B, T], cfg["vocab_size"])
    torch.manual_seed(123)
    model = bg.GPTModel(cfg)
    model.train()
    logits = model(torch.tensor(x).view(B, T))
    loss = F.cross_entropy(logits.flatten(0, 1), torch.tensor(y))
    loss.backward()
    return {"config": cfg, "seed": 123, "B": B, "T": T, "ids": x, "targets": y,
            "logits": tensor_json(logits), "loss": float(loss), "grads": grads_json(model)}


def module_case(build, x_shape, seed, train=True, x_fn=None) -> dict:
    """manual_seed(seed); m = build(); x = randn(x_shape) (or x_fn()); y = m(x);
    dy = randn(y.shape); y.backward(dy)."""
    torch.manual_seed(seed)
    m = build()
    m.train(train)
    params0 = {n: tensor_bits_json(p) for n, p in m.named_parameters()}
    x = (x_fn() if x_fn else torch.randn(x_shape)).requires_grad_(True)
    y = m(x)
    dy = torch.randn(y.shape)
    y.backward(dy)
    return {"seed": seed, "params": params0, "x": tensor_json(x), "y": tensor_json(y),
            "dy": tensor_json(dy), "dx": tensor_json(x.grad), "grads": grads_json(m)}


class RMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm / Qwen3RMSNorm (offset 0) and Gemma3RMSNorm (offset 1:
    the row scaled by 1 + weight), in our words: x · rsqrt(mean(x²) + eps) · (weight + offset)."""

    def __init__(self, dim, eps, offset):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = torch.nn.Parameter(torch.ones(dim) if offset == 0 else torch.zeros(dim))

    def forward(self, x):
        x_normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x_normed * (self.weight + self.offset)


class GatedFeedForward(torch.nn.Module):
    """The book's Llama FeedForward (fc1, fc2, fc3, no biases), in our words:
    fc3(act(fc1(x)) * fc2(x)), act SiLU (Llama 3, Qwen3) or GELU's tanh form (Gemma 3)."""

    def __init__(self, emb_dim, hidden_dim, act):
        super().__init__()
        self.fc1 = torch.nn.Linear(emb_dim, hidden_dim, bias=False)
        self.fc2 = torch.nn.Linear(emb_dim, hidden_dim, bias=False)
        self.fc3 = torch.nn.Linear(hidden_dim, emb_dim, bias=False)
        self.act = act

    def forward(self, x):
        h1 = self.fc1(x)
        a = F.silu(h1) if self.act == "silu" else F.gelu(h1, approximate="tanh")
        return self.fc3(a * self.fc2(x))


def gen_layers() -> dict:
    cfg = dict(SMALL, qkv_bias=True)

    def rms_norm(eps, offset):
        def build():
            m = RMSNorm(32, eps, offset)
            with torch.no_grad():  # a non-trivial scale, so that its gradient matters
                m.weight.copy_((1.0 - offset) + 0.5 * torch.randn(32))
            return m
        return build

    def layer_norm():
        ln = bg.LayerNorm(32)
        with torch.no_grad():  # non-trivial scale and shift so their gradients matter
            ln.scale.copy_(1.0 + 0.5 * torch.randn(32))
            ln.shift.copy_(0.5 * torch.randn(32))
        return ln

    out = {
        "layer_norm": module_case(layer_norm, [2, 5, 32], 11),
        "layer_norm_offset": module_case(layer_norm, None, 12,
                                         x_fn=lambda: 100.0 + 0.01 * torch.randn(3, 4, 32)),
        "gelu": module_case(bg.GELU, None, 13, x_fn=lambda: 3.0 * torch.randn(3, 7, 17)),
        "rms_norm": module_case(rms_norm(1e-5, 0.0), [2, 5, 32], 19),
        "swiglu": module_case(lambda: GatedFeedForward(32, 48, "silu"), [2, 5, 32], 21),
        "geglu": module_case(lambda: GatedFeedForward(32, 48, "gelu_tanh"), [2, 5, 32], 22),
        "rms_norm_gemma": module_case(rms_norm(1e-6, 1.0), None, 20,
                                      x_fn=lambda: 4.0 * torch.randn(3, 4, 32)),
        "feed_forward": module_case(lambda: bg.FeedForward(cfg), [2, 5, 32], 14),
        "transformer_block": module_case(lambda: bg.TransformerBlock(cfg), [2, 7, 32], 15),
        "transformer_block_dropout": module_case(
            lambda: bg.TransformerBlock(dict(cfg, drop_rate=0.1)), [2, 7, 32], 16),
    }
    out["transformer_block"]["config"] = cfg
    out["transformer_block_dropout"]["config"] = dict(cfg, drop_rate=0.1)

    ce = []
    for seed, scale, shape, ignore in [(17, 1.0, [2, 5, 11], [3]), (18, 30.0, [3, 4, 64], [])]:
        torch.manual_seed(seed)
        logits = (scale * torch.randn(shape)).requires_grad_(True)
        targets = ids(random.Random(seed), shape[:2], shape[2])
        for i in ignore:
            targets[i] = -100
        loss = F.cross_entropy(logits.flatten(0, 1), torch.tensor(targets))
        loss.backward()
        ce.append({"logits": tensor_json(logits), "targets": targets, "loss": float(loss),
                   "dlogits": tensor_json(logits.grad)})
    out["cross_entropy"] = ce
    return out


def gen_optim() -> dict:
    torch.manual_seed(21)
    grads = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2)]
    clip = []
    for max_norm in [1.0, 100.0]:
        ps = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(ps, max_norm)
        clip.append({"max_norm": max_norm, "total_norm": float(total),
                     "grads": [tensor_json(g) for g in grads],
                     "clipped": [tensor_json(p.grad) for p in ps]})

    torch.manual_seed(22)
    p = torch.randn(4, 5).requires_grad_(True)
    p0 = p.detach().clone()
    hp = {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
    opt = torch.optim.AdamW([p], lr=hp["lr"], betas=tuple(hp["betas"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"], foreach=False)
    step_grads, after = [], []
    for _ in range(5):
        g = torch.randn(4, 5)
        p.grad = g.clone()
        opt.step()
        step_grads.append(tensor_json(g))
        after.append(tensor_bits_json(p))
    return {"clip": clip, "adamw": {"hp": hp, "p0": tensor_bits_json(p0), "grads": step_grads,
                                    "after": after}}


def gen_schedule() -> dict:
    hp = {"learning_rate": 6e-4, "min_lr": 6e-5, "warmup_iters": 10, "lr_decay_iters": 50}
    return {"hp": hp, "lr": [get_lr(it, **hp) for it in range(60)]}


def gen_train(drop_rate: float, keep_params: bool) -> dict:
    cfg = dict(SMALL, drop_rate=drop_rate)
    t = TRAIN
    # A 48-token "text" and next-token batches cut from it at random offsets,
    # as the book's data loader does, so that the loss falls.
    rng = random.Random(99)
    text = ids(rng, [48], cfg["vocab_size"])
    batches = []
    for _ in range(t["steps"]):
        starts = [rng.randrange(len(text) - t["tokens"]) for _ in range(t["batch"])]
        batches.append(([text[s + i] for s in starts for i in range(t["tokens"])],
                        [text[s + i + 1] for s in starts for i in range(t["tokens"])]))
    torch.manual_seed(123)
    model = bg.GPTModel(cfg)
    model.train()
    params = [p for p in model.parameters()]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t["learning_rate"], betas=(t["beta1"], t["beta2"]), eps=t["eps"],
                            foreach=False)
    steps = []
    for it, (x, y) in enumerate(batches):
        lr = get_lr(it, t["learning_rate"], t["min_lr"], t["warmup_iters"], t["lr_decay_iters"])
        for group in opt.param_groups:
            group["lr"] = lr
        logits = model(torch.tensor(x).view(t["batch"], t["tokens"]))
        loss = F.cross_entropy(logits.flatten(0, 1), torch.tensor(y))
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t["max_norm"])
        opt.step()
        steps.append({"lr": lr, "loss": float(loss), "grad_norm": float(norm)})
    out = {"config": cfg, "seed": 123, "hp": t, "batches": batches, "steps": steps}
    if keep_params:
        out["final_params"] = {n: tensor_json(p) for n, p in model.named_parameters()}
    return out


def compute(out_dir: pathlib.Path) -> None:
    payload = {
        "torch": torch.__version__,
        "cpu_capability": cpu_capability(),
        "init": gen_init(),
        "init_124m": gen_init_124m(),
        "forward": [gen_forward(0.0), gen_forward(0.1)],
        "layers": gen_layers(),
        "optim": gen_optim(),
        "schedule": gen_schedule(),
        "train": [gen_train(0.0, True), gen_train(0.1, False)],
    }
    write_json(pathlib.Path(out_dir) / "gpt.json", payload)


def generate(out_dir) -> None:
    run_under_avx2(__file__, out_dir, compute)


if __name__ == "__main__":
    torch.set_num_threads(1)
    compute(pathlib.Path(sys.argv[1]))
