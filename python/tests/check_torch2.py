"""attn.scaled_dot_product_attention against PyTorch 2.x's own
torch.nn.functional.scaled_dot_product_attention: outputs and the gradients of
query, key and value, fp32 and bf16, on the options both have (masks,
is_causal, scale, enable_gqa (PyTorch >= 2.5), Dv != D, non-contiguous views);
broadcast batch dims and the gradient of a float attn_mask (PyTorch's own);
then attn.patch_sdpa, torch.compile (fullgraph, PyTorch >= 2.4) and a small
nanoGPT-shaped model patched vs unpatched. Not run by ctest (Debian's PyTorch is 1.13); run in a
virtual environment with PyTorch 2.x and attn installed (docs/python.md):

    python -m venv /tmp/attn-venv && /tmp/attn-venv/bin/pip install torch .
    /tmp/attn-venv/bin/python python/tests/check_torch2.py

Prints one line per case with the largest |attn - torch| of out, dq, dk, dv
(and the comparison's bound), then the largest per dtype; exits 1 if any case
is outside its bound. fp32: 2e-5 · max(1, max|torch|) (PyTorch's fp32 CPU
SDPA and attn's kernel each sum in fp32, in different orders). bf16: both
round to bf16 at the end, and PyTorch's CPU flash kernel rounds the weights P
to bf16 before P·V while attn keeps them fp32, so the bound is measured
against the float64 maths (python/tests/test_sdpa.py's bounds) and the
difference to PyTorch is reported beside it.
"""

import contextlib
import math
import sys

import torch
import torch.nn.functional as F

import attn

if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 0):
    sys.exit(f"check_torch2.py needs PyTorch >= 2.0, this is {torch.__version__}")
GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)

F64 = torch.float64


def maths(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """The float64 definition, as python/tests/test_sdpa.py's oracle (no extras here)."""
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if attn_mask is not None:
        s = (s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool
             else s + attn_mask.to(F64))
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(s, -1) @ v


def cases():
    g = torch.Generator().manual_seed(0)
    yield "plain", (2, 4, 4, 64, 64, 64, 64), {}
    yield "causal", (2, 4, 4, 128, 128, 64, 64), dict(is_causal=True)
    yield "causal L<S", (1, 4, 4, 17, 70, 32, 32), dict(is_causal=True)
    yield "scale", (2, 2, 2, 50, 50, 32, 32), dict(scale=0.2)
    yield "Dv != D", (1, 3, 3, 40, 33, 24, 40), {}
    m = torch.rand(2, 1, 64, 80, generator=g) < 0.7
    m[..., 0] = True
    yield "bool mask (B,1,L,S)", (2, 4, 4, 64, 80, 32, 32), dict(attn_mask=m)
    fm = torch.randn(64, 64, generator=g)
    fm[torch.rand(64, 64, generator=g) < 0.2] = -math.inf
    fm[:, 0] = 0
    yield "float mask (L,S)", (2, 4, 4, 64, 64, 32, 32), dict(attn_mask=fm)
    if GQA:
        yield "gqa 8/2 causal", (2, 8, 2, 96, 96, 64, 64), dict(enable_gqa=True, is_causal=True)
    yield "token-major views", (2, 4, 4, 64, 64, 64, 64), dict(layout="token_major",
                                                                is_causal=True)
    yield "T=512 causal", (1, 6, 6, 512, 512, 64, 64), dict(is_causal=True)


def make(sizes, dtype, layout, g):
    B, Hq, Hkv, L, S, E, Ev = sizes
    if layout == "token_major":
        return (torch.randn(B, L, Hq, E, generator=g).to(dtype).transpose(1, 2),
                torch.randn(B, S, Hkv, E, generator=g).to(dtype).transpose(1, 2),
                torch.randn(B, S, Hkv, Ev, generator=g).to(dtype).transpose(1, 2))
    return (torch.randn(B, Hq, L, E, generator=g).to(dtype),
            torch.randn(B, Hkv, S, E, generator=g).to(dtype),
            torch.randn(B, Hkv, S, Ev, generator=g).to(dtype))


def compare_sdpa():
    ok = True
    worst = {}
    for dtype in (torch.float32, torch.bfloat16):
        for name, sizes, kw in cases():
            kw = dict(kw)
            layout = kw.pop("layout", "contiguous")
            g = torch.Generator().manual_seed(1)
            q, k, v = make(sizes, dtype, layout, g)
            if "attn_mask" in kw and kw["attn_mask"].dtype != torch.bool:
                kw["attn_mask"] = kw["attn_mask"].to(dtype)
            dout = torch.randn(*sizes[:2], sizes[3], sizes[6], generator=g).to(dtype)
            results = {}
            for who, fn in (("attn", attn.scaled_dot_product_attention),
                            ("torch", F.scaled_dot_product_attention)):
                qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
                out = fn(qq, kk, vv, **kw)
                grads = torch.autograd.grad(out, (qq, kk, vv), dout)
                results[who] = (out.detach(),) + tuple(grads)
            q64, k64, v64 = (t.detach().to(F64).requires_grad_(True) for t in (q, k, v))
            out64 = maths(q64, k64, v64, **kw)
            results["f64"] = (out64.detach(),) + torch.autograd.grad(out64, (q64, k64, v64),
                                                                     dout.to(F64))
            amx = dtype == torch.bfloat16 and attn._path(q, k, v, **kw) in ("AMX", "AVX512-BF16")
            line = []
            case_ok = True
            for n, what in enumerate(("out", "dq", "dk", "dv")):
                a = results["attn"][n].to(F64)
                t = results["torch"][n].to(F64)
                r = results["f64"][n]
                big = max(1.0, r.abs().max().item())
                d_torch = (a - t).abs().max().item()
                if dtype == torch.float32:
                    bound = 2e-5 * max(1.0, t.abs().max().item())
                    good = d_torch <= bound
                    ratio = d_torch / bound
                else:
                    # attn against the float64 maths within the bf16 bounds of test_sdpa.py;
                    # on the AMX route (attn._path), which rounds P and dS to bf16 as
                    # PyTorch's kernel does, test_sdpa_amx.py's: 8e-3 (out) and 4e-2
                    # (gradients) times max|maths|
                    loose = what in ("dq", "dk")
                    if amx:
                        b = torch.full_like(r, (8e-3 if what == "out" else 4e-2)
                                            * max(r.abs().max().item(), 1e-30))
                    else:
                        b = 2.0**-8 * r.abs() + (1e-2 if loose else 1e-4) * big
                    ratio = ((a - r).abs() / b).max().item()
                    good = ratio <= 1.0
                    # PyTorch's own bf16 result against the same bound, for comparison.
                    torch_ratio = ((t - r).abs() / b).max().item()
                    key_t = ("bfloat16 (torch's own error / bound)", what)
                    worst[key_t] = max(worst.get(key_t, 0.0), torch_ratio)
                key = (str(dtype).replace("torch.", ""), what)
                worst[key] = max(worst.get(key, 0.0), d_torch)
                line.append(f"{what} {d_torch:.2e} ({ratio:.2f})")
                case_ok &= good
            ok &= case_ok
            print(f"{str(dtype).replace('torch.', ''):9s} {name:22s} " + "  ".join(line)
                  + ("  [AMX]" if amx else "") + ("" if case_ok else "  <-- FAIL"))
    print("largest |attn - torch.nn.functional.scaled_dot_product_attention| (and, for bf16, "
          "PyTorch's own error against the float64 maths as a fraction of attn's bound):")
    for (dt, what), d in sorted(worst.items()):
        print(f"  {dt:9s} {what}: {d:.3e}" if "own" not in dt else f"  {dt} {what}: {d:.2f}")
    return ok


def check_broadcast_and_mask_grad():
    """Broadcast batch dims and heads, and the gradient of a float attn_mask that
    requires grad, against PyTorch's SDPA itself (fp32; out and every gradient
    within 2e-5 · max(1, max|torch|)); then the mask gradient through
    torch.compile (attn's custom ops) against eager."""
    ok = True
    g = torch.Generator().manual_seed(4)
    shapes = [
        ("key/value batch 1", (2, 3, 9, 8), (1, 3, 11, 8), (1, 3, 11, 8), None),
        ("3-D key, 4-D query", (2, 3, 9, 8), (3, 11, 8), (3, 11, 8), None),
        ("2-D key/value", (2, 3, 9, 8), (11, 8), (11, 8), None),
        ("one key/value head", (2, 4, 9, 8), (2, 1, 11, 8), (2, 1, 11, 8), None),
        ("5-D both ways", (2, 4, 3, 9, 8), (2, 1, 3, 11, 8), (1, 4, 3, 11, 8), None),
        ("mask grad (L,S)", (2, 3, 9, 8), (2, 3, 11, 8), (2, 3, 11, 8), (9, 11)),
        ("mask grad (B,1,L,S)", (2, 3, 9, 8), (2, 3, 11, 8), (2, 3, 11, 8), (2, 1, 9, 11)),
        ("mask grad, broadcast", (3, 2, 9, 8), (1, 2, 11, 8), (3, 2, 11, 8), (3, 2, 9, 11)),
    ]
    for name, sq, sk, sv, smask in shapes:
        q, k, v = (torch.randn(*s, generator=g) for s in (sq, sk, sv))
        mask = None if smask is None else torch.randn(*smask, generator=g)
        results = {}
        for who, fn in (("attn", attn.scaled_dot_product_attention),
                        ("torch", F.scaled_dot_product_attention)):
            ins = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
            m = None if mask is None else mask.detach().clone().requires_grad_(True)
            out = fn(*ins, attn_mask=m)
            dout = torch.ones_like(out) + torch.arange(out.numel()).reshape(out.shape) % 7 / 7
            grads = torch.autograd.grad(out, ins + ([] if m is None else [m]), dout)
            results[who] = (out,) + tuple(grads)
        worst = 0.0
        for a, t in zip(results["attn"], results["torch"]):
            assert a.shape == t.shape, name
            worst = max(worst, (a - t).abs().max().item() / (2e-5 * max(1.0, t.abs().max().item())))
        print(f"float32   {name:22s} out and every gradient: largest |attn - torch| "
              f"{worst:.2f} of the bound" + ("" if worst <= 1.0 else "  <-- FAIL"))
        ok &= worst <= 1.0
    if attn._sdpa._OPS is not None:
        q, k, v = (torch.randn(2, 3, 16, 8, generator=g, requires_grad=True) for _ in range(3))
        mask = torch.randn(16, 16, generator=g, requires_grad=True)

        def call(q, k, v, mask):
            return attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        ge = torch.autograd.grad(call(q, k, v, mask).sum(), (q, k, v, mask))
        compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
        gc = torch.autograd.grad(compiled(q, k, v, mask).sum(), (q, k, v, mask))
        d = max((a - b).abs().max().item() for a, b in zip(gc, ge))
        print(f"torch.compile(aot_eager, fullgraph=True) with a mask requiring grad: "
              f"gradients vs eager {d:.1e}")
        ok &= d < 1e-6
    return ok


def check_patch():
    """attn.patch_sdpa routes F.scaled_dot_product_attention to attn; the context
    manager restores it; what attn does not cover falls back to PyTorch."""
    if not hasattr(attn, "patch_sdpa"):
        print("patch_sdpa: not in this build")
        return True
    original = F.scaled_dot_product_attention
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=g) for _ in range(3))
    calls = attn.sdpa_stats()
    with attn.sdpa_patched():
        assert F.scaled_dot_product_attention is not original
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        f64 = F.scaled_dot_product_attention(q.double(), k.double(), v.double())  # falls back
    assert F.scaled_dot_product_attention is original
    after = attn.sdpa_stats()
    assert after["attn"] == calls["attn"] + 1, after
    assert after["torch"] == calls["torch"] + 1, after
    assert torch.allclose(a, original(q, k, v, is_causal=True), atol=1e-5)
    assert f64.dtype == torch.float64
    print("patch_sdpa: routed fp32 to attn, float64 to PyTorch, restored on exit")
    return True


def check_compile():
    """torch.compile (PyTorch >= 2.4) with fullgraph=True: attn's call, and PyTorch's SDPA
    under patch_sdpa, compile without a graph break (attn's custom ops) and match eager."""
    if attn._sdpa._OPS is None:
        print("torch.compile: no torch.library.custom_op in this PyTorch; skipped")
        return True
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 64, 32, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.rand(64, 64, generator=g) < 0.8
    mask[:, 0] = True
    ok = True

    def direct(q, k, v):
        return attn.scaled_dot_product_attention(q, k, v, is_causal=True, window_size=(16, 0))

    def through_torch(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    for backend in ("aot_eager", "inductor"):
        eager = direct(q, k, v)
        compiled = torch.compile(direct, backend=backend, fullgraph=True)(q, k, v)
        ge = torch.autograd.grad(eager.sum(), (q, k, v))
        gc = torch.autograd.grad(compiled.sum(), (q, k, v))
        d = max([(compiled - eager).abs().max().item()]
                + [(a - b).abs().max().item() for a, b in zip(gc, ge)])
        with attn.sdpa_patched():
            before = attn.sdpa_stats()["attn"]
            patched = torch.compile(through_torch, backend=backend, fullgraph=True)(q, k, v, mask)
            routed = attn.sdpa_stats()["attn"] - before
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        dp = (patched - reference).abs().max().item()
        print(f"torch.compile({backend}, fullgraph=True): attn's call vs eager {d:.1e} "
              f"(out and grads); patched F.scaled_dot_product_attention routed to attn "
              f"{routed}x while tracing, vs PyTorch {dp:.1e}")
        ok &= d == 0.0 and dp < 1e-5 and routed >= 1
    return ok


class _Block(torch.nn.Module):
    """A GPT-2 block in the usual form (pre-LayerNorm, causal self-attention through
    F.scaled_dot_product_attention, GELU MLP), written here for the check."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
        return x + self.mlp(self.ln2(x))


class _TinyGPT(torch.nn.Module):
    def __init__(self, vocab=65, d=192, heads=6, layers=4, block=256):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(block, d)
        self.blocks = torch.nn.Sequential(*[_Block(d, heads) for _ in range(layers)])
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.blocks(self.tok(idx) + self.pos(torch.arange(T)))
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def check_model():
    """A character-level GPT in nanoGPT's shape (its code not used), unpatched and under
    patch_sdpa: the same loss and gradients (fp32), and the time of a training step."""
    import time

    torch.manual_seed(0)
    model = _TinyGPT()
    g = torch.Generator().manual_seed(4)
    idx = torch.randint(0, 65, (8, 256), generator=g)
    targets = torch.randint(0, 65, (8, 256), generator=g)

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss_t, grads_t = step()
    with attn.sdpa_patched():
        loss_a, grads_a = step()
    dgrad = max((a - b).abs().max().item() for a, b in zip(grads_a, grads_t))
    times = {}
    for name, patched in (("torch", False), ("attn", True)):
        ctx = attn.sdpa_patched() if patched else contextlib.nullcontext()
        with ctx:
            step()
            t0 = time.perf_counter()
            for _ in range(5):
                step()
            times[name] = (time.perf_counter() - t0) / 5 * 1e3
    print(f"tiny GPT (4 layers, d 192, 6 heads, B 8, T 256), fp32: loss {loss_t.item():.6f} "
          f"unpatched, {loss_a.item():.6f} patched (|diff| {abs(loss_a - loss_t).item():.1e}), "
          f"largest gradient |diff| {dgrad:.1e}; training step {times['torch']:.0f} ms "
          f"unpatched, {times['attn']:.0f} ms patched (under load, "
          f"{torch.get_num_threads()} threads)")
    return abs(loss_a - loss_t).item() < 1e-5 and dgrad < 1e-4


def check_tokenizer():
    """attn.Tokenizer against tiktoken itself (when installed; its gpt2 encoding built
    offline from data/gpt2 by tests/fixtures/make_tokenizer_fixtures.py): random texts,
    the special-token rules, and decode."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        print("tokenizer: tiktoken not installed; skipped")
        return True
    import os
    import random

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "tests", "fixtures"))
    import make_tokenizer_fixtures

    enc, tok = make_tokenizer_fixtures.gpt2(), attn.Tokenizer()
    rng = random.Random(0)
    pool = ["Hello", " world", "  ", "\n\n", "\t", "'s", "'ll", "123", "4.5", "ÆØÅ", "漢字",
            "😀", "—", "<|endoftext|>", "<|endoftext", "|>", " a", "x" * 30, "\r\n", "café"]
    texts = ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40))) for _ in range(2000)]
    bad = 0
    for t in texts:
        bad += tok.encode(t, allowed_special="all") != enc.encode(t, allowed_special="all")
        bad += tok.encode_ordinary(t) != enc.encode_ordinary(t)
        bad += tok.decode(enc.encode_ordinary(t)) != enc.decode(enc.encode_ordinary(t))
        for fn in (tok.encode, enc.encode):
            try:
                fn(t)
                raised = False
            except ValueError:
                raised = True
            bad += raised != ("<|endoftext|>" in t)
    print(f"tokenizer: {len(texts)} random texts, encode/encode_ordinary/decode/special-token "
          f"errors against tiktoken {tiktoken.__version__}: {bad} differences")
    return bad == 0


if __name__ == "__main__":
    print(f"torch {torch.__version__}, attn {attn.__version__} (kernel target "
          f"{attn.kernel_target()}), {torch.get_num_threads()} threads")
    good = compare_sdpa()
    good &= check_broadcast_and_mask_grad()
    good &= check_patch()
    good &= check_compile()
    good &= check_model()
    good &= check_tokenizer()
    sys.exit(0 if good else 1)
