"""attn.nn's modules against the project's PyTorch reference classes (written
from the book in tests/torch/book_modules.py, book_gpt.py and the GQA/SWA
attention of oracle_gqa_swa.py, the oracles of the C++ tests): the same
state_dict loads strictly, and outputs and every gradient agree (eval mode:
no dropout)."""

import os
import sys

import pytest
import torch

import attn
import attn.nn as ann

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
import book_gpt  # noqa: E402
import book_modules  # noqa: E402
import oracle_gqa_swa  # noqa: E402


def compare(ours, ref, x, tol=2e-5):
    """Loads ref's state_dict into ours (strict), then compares the output and the
    gradients of the input and of every parameter, relative to max(1, max|ref|)."""
    ours.load_state_dict(ref.state_dict(), strict=True)
    ours.eval(), ref.eval()
    outs = []
    for m in (ours, ref):
        xi = x.detach().clone().requires_grad_(x.is_floating_point())
        y = m(xi)
        g = torch.Generator().manual_seed(5)
        dy = torch.randn(y.shape, generator=g)
        (y * dy).sum().backward()
        grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
        outs.append((y.detach(), xi.grad if xi.requires_grad else None, grads))
        m.zero_grad(set_to_none=True)
    (y1, gx1, g1), (y2, gx2, g2) = outs
    big = max(1.0, y2.abs().max().item())
    assert (y1 - y2).abs().max().item() <= tol * big
    if gx2 is not None:
        assert (gx1 - gx2).abs().max().item() <= tol * max(1.0, gx2.abs().max().item())
    assert g1.keys() == g2.keys()
    for n in g2:
        assert (g1[n] - g2[n]).abs().max().item() <= tol * max(1.0, g2[n].abs().max().item()), n


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_causal_attention(qkv_bias):
    torch.manual_seed(0)
    ref = book_modules.CausalAttention(8, 6, 12, 0.0, qkv_bias)
    compare(ann.CausalAttention(8, 6, 12, 0.0, qkv_bias), ref, torch.randn(3, 10, 8))


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_multi_head_attention(qkv_bias):
    torch.manual_seed(1)
    ref = book_modules.MultiHeadAttention(16, 24, 20, 0.1, 4, qkv_bias)
    ours = ann.MultiHeadAttention(16, 24, 20, 0.1, 4, qkv_bias)
    assert list(ours.state_dict()) == list(ref.state_dict())
    compare(ours, ref, torch.randn(2, 17, 16))


@pytest.mark.parametrize("gqa,groups,window", [(True, 2, None), (True, 1, None), (False, 4, 5),
                                               (False, 4, None)])
def test_gqa_and_swa(gqa, groups, window):
    torch.manual_seed(2)
    ref = oracle_gqa_swa.Attention(16, 32, 4, groups, True, window, gqa)
    if gqa:
        ours = ann.GroupedQueryAttention(16, 32, 0.0, 4, groups, qkv_bias=True)
    else:
        ours = ann.MultiHeadAttentionWithSWA(16, 32, 0.0, 4, qkv_bias=True,
                                             sliding_window_size=window)
    compare(ours, ref, torch.randn(2, 19, 16))


def test_gpt_model():
    cfg = dict(vocab_size=97, context_length=32, emb_dim=48, n_heads=4, n_layers=2,
               drop_rate=0.1, qkv_bias=True)
    torch.manual_seed(3)
    ref = book_gpt.GPTModel(cfg)
    ours = ann.GPTModel(cfg)
    assert list(ours.state_dict()) == list(ref.state_dict())
    idx = torch.randint(0, 97, (2, 30), generator=torch.Generator().manual_seed(4))
    compare(ours, ref, idx)


def test_training_mode_applies_dropout_and_eval_does_not():
    torch.manual_seed(6)
    m = ann.MultiHeadAttention(16, 16, 20, 0.5, 2)
    x = torch.randn(2, 12, 16)
    m.eval()
    a, b = m(x), m(x)
    assert torch.equal(a, b)
    m.train()
    torch.manual_seed(1)
    c = m(x)
    torch.manual_seed(2)
    d = m(x)
    assert not torch.equal(c, d) and not torch.equal(c, a)
