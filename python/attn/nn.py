"""attn.nn: the book's attention modules ("Build a Large Language Model (From
Scratch)", chapters 3-4 and the GQA/SWA bonus material) as torch.nn.Modules
with the book's constructor arguments and state_dict keys, their attention
core on attn's fused kernel (attn.scaled_dot_product_attention).

A state_dict saved from the book's classes loads into these (strict), and the
other way round. The projections are PyTorch's nn.Linear; the heads are
token-major views of their outputs, read by attn's kernel in place (no
transposed copies). Dropout on the attention weights uses attn's own noise
(docs/python.md): the same rate, not the same draws as nn.Dropout. No KV cache
(the book's use_cache) here.
"""

from __future__ import annotations

import math
from typing import Optional

from ._torch import require

torch = require("attn.nn")
import torch.nn as nn  # noqa: E402

from ._sdpa import scaled_dot_product_attention as _sdpa

__all__ = ["CausalAttention", "MultiHeadAttention", "GroupedQueryAttention",
           "MultiHeadAttentionWithSWA", "LayerNorm", "GELU", "FeedForward", "TransformerBlock",
           "GPTModel"]


def _heads(t: torch.Tensor, n: int) -> torch.Tensor:
    # (b, T, n * hd) -> (b, n, T, hd): a view, token-major strides.
    b, T, width = t.shape
    return t.view(b, T, n, width // n).transpose(1, 2)


def _merge(ctx: torch.Tensor) -> torch.Tensor:
    # (b, H, T, hd) -> (b, T, H * hd)
    b, H, T, hd = ctx.shape
    return ctx.transpose(1, 2).reshape(b, T, H * hd)


def _qkv_linears(m: nn.Module, d_in: int, d_q: int, d_kv: int, qkv_bias: bool, dtype=None,
                 order=("W_query", "W_key", "W_value")) -> None:
    """The book's W_query (d_in -> d_q), W_key and W_value (d_in -> d_kv), registered
    in `order` (the book's order, so state_dict lists the keys as the book's does)."""
    width = {"W_query": d_q, "W_key": d_kv, "W_value": d_kv}
    for name in order:
        setattr(m, name, nn.Linear(d_in, width[name], bias=qkv_bias, dtype=dtype))


def _causal_mask_buffer(m: nn.Module, context_length: int) -> None:
    # The book's `mask` buffer (triu of ones), kept for its state_dict key: the
    # kernel applies the causal band itself.
    m.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))


class _MultiHead(nn.Module):
    """What the book's multi-head modules share: num_heads heads of head_dim =
    d_out // num_heads over num_kv_heads key/value heads, the projections, out_proj,
    dropout on the attention weights; forward runs attn's kernel on token-major
    views of the projections (no copies) and merges the heads."""

    def _set_up(self, d_in, d_out, dropout, num_heads, num_kv_heads, qkv_bias, *,
                dtype=None, out_bias=True, order=("W_query", "W_key", "W_value")):
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self._kv_heads = num_kv_heads
        _qkv_linears(self, d_in, d_out, num_kv_heads * self.head_dim, qkv_bias, dtype, order)
        self.out_proj = nn.Linear(d_out, d_out, bias=out_bias, dtype=dtype)
        self.dropout = nn.Dropout(dropout)

    def _attend(self, x, **kw):  # x (b, T, d_in) -> (b, T, d_out)
        q = _heads(self.W_query(x), self.num_heads)
        k = _heads(self.W_key(x), self._kv_heads)
        v = _heads(self.W_value(x), self._kv_heads)
        p = self.dropout.p if self.training else 0.0
        return self.out_proj(_merge(_sdpa(q, k, v, dropout_p=p, is_causal=True, **kw)))


class CausalAttention(nn.Module):
    """Chapter 3's single-head causal attention: W_query, W_key, W_value
    (nn.Linear(d_in, d_out, bias=qkv_bias)), dropout on the weights, and the
    `mask` buffer (triu of ones) the book registers (kept for its state_dict
    key; the kernel applies the causal band itself)."""

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.d_out = d_out
        _qkv_linears(self, d_in, d_out, d_out, qkv_bias)
        self.dropout = nn.Dropout(dropout)
        _causal_mask_buffer(self, context_length)

    def forward(self, x):  # x (b, T, d_in) -> (b, T, d_out)
        """Causal attention of x (b, T, d_in) -> (b, T, d_out), one head."""
        q, k, v = (self.W_query(x).unsqueeze(1), self.W_key(x).unsqueeze(1),
                   self.W_value(x).unsqueeze(1))
        p = self.dropout.p if self.training else 0.0
        return _sdpa(q, k, v, dropout_p=p, is_causal=True).squeeze(1)


class MultiHeadAttention(_MultiHead):
    """Chapter 3's MultiHeadAttention (weight splits): W_query, W_key, W_value,
    out_proj, dropout, the `mask` buffer; heads of head_dim = d_out // num_heads."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self._set_up(d_in, d_out, dropout, num_heads, num_heads, qkv_bias)
        _causal_mask_buffer(self, context_length)

    def forward(self, x):  # x (b, T, d_in) -> (b, T, d_out)
        """Causal multi-head attention of x (b, T, d_in) -> (b, T, d_out)."""
        return self._attend(x)


class GroupedQueryAttention(_MultiHead):
    """ch04/04_gqa's GroupedQueryAttention: W_key and W_value project to
    num_kv_groups heads shared by num_heads // num_kv_groups query heads each
    (read in place by the kernel, no repeat_interleave); out_proj without bias."""

    def __init__(self, d_in, d_out, dropout, num_heads, num_kv_groups, dtype=None,
                 qkv_bias=False):
        super().__init__()
        assert num_heads % num_kv_groups == 0, "num_heads must be divisible by num_kv_groups"
        self._set_up(d_in, d_out, dropout, num_heads, num_kv_groups, qkv_bias, dtype=dtype,
                     out_bias=False, order=("W_key", "W_value", "W_query"))
        self.num_kv_groups = num_kv_groups
        self.group_size = num_heads // num_kv_groups

    def forward(self, x):
        """Causal grouped-query attention of x (b, T, d_in) -> (b, T, d_out)."""
        return self._attend(x, enable_gqa=True)


class MultiHeadAttentionWithSWA(_MultiHead):
    """ch04/06_swa's MultiHeadAttentionWithSWA: query i sees keys j with
    0 <= i - j < sliding_window_size (None: every earlier key); the window
    costs O(T·w) in the kernel, not O(T²)."""

    def __init__(self, d_in, d_out, dropout, num_heads, qkv_bias=False,
                 sliding_window_size: Optional[int] = None):
        super().__init__()
        self._set_up(d_in, d_out, dropout, num_heads, num_heads, qkv_bias)
        self.sliding_window_size = sliding_window_size

    def forward(self, x):
        """Causal sliding-window attention of x (b, T, d_in) -> (b, T, d_out)."""
        w = self.sliding_window_size
        return self._attend(x, window_size=None if w is None else (int(w) - 1, 0))


class LayerNorm(nn.Module):
    """Chapter 4's LayerNorm: scale, shift; eps 1e-5; biased variance."""

    def __init__(self, emb_dim):
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x):
        """Normalises the last dim: scale · (x − mean) / sqrt(var + eps) + shift."""
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return self.scale * ((x - mean) / torch.sqrt(var + self.eps)) + self.shift


class GELU(nn.Module):
    """Chapter 4's GELU, the tanh approximation."""

    def forward(self, x):
        """0.5 · x · (1 + tanh(sqrt(2/π) · (x + 0.044715 · x³)))."""
        return 0.5 * x * (1 + torch.tanh(torch.sqrt(torch.tensor(2.0 / math.pi))
                                         * (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    """layers = Sequential(Linear(E, 4E), GELU(), Linear(4E, E))."""

    def __init__(self, cfg):
        super().__init__()
        E = cfg["emb_dim"]
        self.layers = nn.Sequential(nn.Linear(E, 4 * E), GELU(), nn.Linear(4 * E, E))

    def forward(self, x):
        """Linear, GELU, Linear on the last dim."""
        return self.layers(x)


class TransformerBlock(nn.Module):
    """Chapter 4's block: att, ff, norm1, norm2, drop_shortcut (pre-LayerNorm,
    shortcut connections). att is MultiHeadAttention, or with cfg["n_kv_groups"]
    GroupedQueryAttention, and with cfg["sliding_window_size"] (MHA) the
    windowed one."""

    def __init__(self, cfg):
        super().__init__()
        E = cfg["emb_dim"]
        if cfg.get("n_kv_groups"):
            self.att = GroupedQueryAttention(d_in=E, d_out=E, dropout=cfg["drop_rate"],
                                             num_heads=cfg["n_heads"],
                                             num_kv_groups=cfg["n_kv_groups"],
                                             qkv_bias=cfg["qkv_bias"])
        elif cfg.get("sliding_window_size"):
            self.att = MultiHeadAttentionWithSWA(d_in=E, d_out=E, dropout=cfg["drop_rate"],
                                                 num_heads=cfg["n_heads"],
                                                 qkv_bias=cfg["qkv_bias"],
                                                 sliding_window_size=cfg["sliding_window_size"])
        else:
            self.att = MultiHeadAttention(d_in=E, d_out=E, context_length=cfg["context_length"],
                                          num_heads=cfg["n_heads"], dropout=cfg["drop_rate"],
                                          qkv_bias=cfg["qkv_bias"])
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(E)
        self.norm2 = LayerNorm(E)
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

    def forward(self, x):
        """x + attention(norm1(x)), then + feed-forward(norm2(x)) (shortcut dropout)."""
        x = x + self.drop_shortcut(self.att(self.norm1(x)))
        return x + self.drop_shortcut(self.ff(self.norm2(x)))


class GPTModel(nn.Module):
    """Chapter 4's GPTModel: tok_emb, pos_emb, drop_emb, trf_blocks, final_norm,
    out_head (no bias); cfg with vocab_size, context_length, emb_dim, n_heads,
    n_layers, drop_rate, qkv_bias (GPT_CONFIG_124M's keys)."""

    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg["n_layers"])])
        self.final_norm = LayerNorm(cfg["emb_dim"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)

    def forward(self, in_idx):  # (b, T) token ids -> (b, T, vocab_size) logits
        """The logits (b, T, vocab_size) of token ids in_idx (b, T)."""
        T = in_idx.shape[1]
        x = self.tok_emb(in_idx) + self.pos_emb(torch.arange(T, device=in_idx.device))
        x = self.trf_blocks(self.drop_emb(x))
        return self.out_head(self.final_norm(x))
