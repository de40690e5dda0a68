"""attn.nn: the book's attention modules ("Build a Large Language Model (From
Scratch)", chapters 3-4 and the bonus scripts ch04/04_gqa, 05_mla and 06_swa,
gpt_with_kv_*.py) as torch.nn.Modules with the book's constructor arguments,
state_dict keys and KV caches, their attention core on attn's fused kernel
(attn.scaled_dot_product_attention).

A state_dict saved from the book's classes loads into these (strict), and the
other way round. The projections are PyTorch's nn.Linear; the heads are
token-major views of their outputs, read by attn's kernel in place (no
transposed copies). Dropout on the attention weights uses attn's own noise
(docs/python.md): the same rate, not the same draws as nn.Dropout.

The KV cache is the book's: forward(x, use_cache=True) appends x's keys and
values (MLA: its latent) to the module's cache and lets x's tokens, at
positions ptr_current_pos, ptr_current_pos + 1, ..., attend to everything
cached; reset_cache() empties it. The buffers hold what the book's do, in its
layouts (GroupedQueryAttention and MultiHeadAttention: cache_k, cache_v
(b, heads, T, head_dim); MultiHeadAttentionWithSWA: (b, T, heads, head_dim),
trimmed to the last sliding_window_size tokens; MultiHeadLatentAttention:
cache_c_kv (b, T, latent_dim)), not in the state_dict, and a call without
the cache treats them as the book's does.
"""

from __future__ import annotations

import math
from typing import Optional

from ._torch import require

torch = require("attn.nn")
import torch.nn as nn  # noqa: E402

from ._sdpa import scaled_dot_product_attention as _sdpa

__all__ = ["CausalAttention", "MultiHeadAttention", "GroupedQueryAttention",
           "MultiHeadAttentionWithSWA", "MultiHeadLatentAttention", "LayerNorm", "GELU", "FeedForward", "TransformerBlock",
           "GPTModel"]


def _heads(t: torch.Tensor, n: int) -> torch.Tensor:
    # (b, T, n * hd) -> (b, n, T, hd): a view, token-major strides.
    b, T, width = t.shape
    return t.view(b, T, n, width // n).transpose(1, 2)


def _merge(ctx: torch.Tensor) -> torch.Tensor:
    # (b, H, T, hd) -> (b, T, H * hd)
    b, H, T, hd = ctx.shape
    return ctx.transpose(1, 2).reshape(b, T, H * hd)


def _band(q_start: int, k_start: int, Tq: int, Tk: int, window: Optional[int]) -> dict:
    """The kernel's keywords for the book's position masks: query i at position
    q_start + i sees key j at k_start + j when 0 <= (q_start + i) - (k_start + j)
    < window (None: no lower bound). The causal band, top-left or bottom-right,
    with a window on the left, when the positions line up so; else the book's
    mask itself (bool, (Tq, Tk))."""
    if window is not None and window < 1:
        raise ValueError(f"sliding_window_size ({window}) must be at least 1")
    delta = q_start - k_start
    kw = {} if window is None else {"window_size": (int(window) - 1, 0)}
    if delta == 0:
        return dict(kw, is_causal=True)
    if delta == Tk - Tq:
        return dict(kw, is_causal=True, causal_alignment="bottom_right")
    diff = (torch.arange(q_start, q_start + Tq)[:, None] - torch.arange(k_start, k_start + Tk)[None, :])
    allowed = diff >= 0
    if window is not None:
        allowed &= diff < window
    return {"attn_mask": allowed}


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

    def _attend(self, x, use_cache=False, **kw):  # x (b, T, d_in) -> (b, T, d_out)
        """Attention of x's tokens (b, T, d_in) -> (b, T, d_out); with use_cache, to
        the cached keys and values too (cache_k, cache_v (b, kv heads, T, head_dim),
        the book's GQA and MHA caches); without, the cache is dropped."""
        b, T, _ = x.shape
        q = _heads(self.W_query(x), self.num_heads)
        k = _heads(self.W_key(x), self._kv_heads)
        v = _heads(self.W_value(x), self._kv_heads)
        q_start = 0
        if use_cache:
            if self.cache_k is not None:
                k = torch.cat([self.cache_k, k], dim=2)
                v = torch.cat([self.cache_v, v], dim=2)
            self.cache_k, self.cache_v = k, v
            q_start = self.ptr_current_pos
            self.ptr_current_pos += T
        else:
            self.cache_k, self.cache_v = None, None
            self.ptr_current_pos = 0
        return self._core(q, k, v, _band(q_start, 0, T, k.shape[2], None), **kw)

    def _core(self, q, k, v, band, **kw):  # heads (b, H, Tq, hd) -> (b, Tq, d_out)
        p = self.dropout.p if self.training else 0.0
        return self.out_proj(_merge(_sdpa(q, k, v, dropout_p=p, **band, **kw)))

    def _cache_buffers(self):
        self.register_buffer("cache_k", None, persistent=False)
        self.register_buffer("cache_v", None, persistent=False)
        self.ptr_current_pos = 0

    def reset_cache(self):
        """Empties the KV cache (the next cached call starts at position 0)."""
        self.cache_k, self.cache_v = None, None
        self.ptr_current_pos = 0


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
    out_proj, dropout, the `mask` buffer; heads of head_dim = d_out // num_heads;
    forward(x, use_cache=False) and reset_cache() as ch04/03_kv-cache's."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self._set_up(d_in, d_out, dropout, num_heads, num_heads, qkv_bias)
        _causal_mask_buffer(self, context_length)
        self._cache_buffers()

    def forward(self, x, use_cache=False):  # x (b, T, d_in) -> (b, T, d_out)
        """Causal multi-head attention of x (b, T, d_in) -> (b, T, d_out); use_cache:
        ch04/03_kv-cache's cache (cache_k, cache_v (b, H, T, head_dim))."""
        return self._attend(x, use_cache)


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
        self._cache_buffers()

    def forward(self, x, use_cache=False):
        """Causal grouped-query attention of x (b, T, d_in) -> (b, T, d_out); use_cache:
        the book's cache (cache_k, cache_v (b, num_kv_groups, T, head_dim))."""
        return self._attend(x, use_cache, enable_gqa=True)


class MultiHeadAttentionWithSWA(_MultiHead):
    """ch04/06_swa's MultiHeadAttentionWithSWA: query i sees keys j with
    0 <= i - j < sliding_window_size (None: every earlier key); the window
    costs O(T·w) in the kernel, not O(T²). The cache (cache_k, cache_v
    (b, T, num_heads, head_dim)) keeps the last sliding_window_size tokens, as
    the book's does."""

    def __init__(self, d_in, d_out, dropout, num_heads, qkv_bias=False,
                 sliding_window_size: Optional[int] = None):
        super().__init__()
        self._set_up(d_in, d_out, dropout, num_heads, num_heads, qkv_bias)
        self.sliding_window_size = sliding_window_size
        self._cache_buffers()

    def forward(self, x, use_cache=False):
        """Causal sliding-window attention of x (b, T, d_in) -> (b, T, d_out)."""
        b, T, _ = x.shape
        H, hd, w = self.num_heads, self.head_dim, self.sliding_window_size
        q = self.W_query(x).view(b, T, H, hd)
        k = self.W_key(x).view(b, T, H, hd)  # token-major (b, T, H, hd), the book's cache layout
        v = self.W_value(x).view(b, T, H, hd)
        q_start = k_start = 0
        if use_cache:
            old_len = 0 if self.cache_k is None else self.cache_k.shape[1]
            if self.cache_k is not None:
                k = torch.cat([self.cache_k, k], dim=1)
                v = torch.cat([self.cache_v, v], dim=1)
            total = k.shape[1]
            if w is not None:  # attend to the last w + T - 1 keys, keep the last w
                keep = min(total, int(w))
                self.cache_k, self.cache_v = k[:, total - keep:], v[:, total - keep:]
                attend = min(total, int(w) + T - 1)
                k, v = k[:, total - attend:], v[:, total - attend:]
            else:
                self.cache_k, self.cache_v = k, v
            q_start = self.ptr_current_pos
            k_start = q_start - old_len + (total - k.shape[1])
            self.ptr_current_pos += T
        else:
            self.ptr_current_pos = 0
        band = _band(q_start, k_start, T, k.shape[1], w)
        return self._core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), band)


class MultiHeadLatentAttention(nn.Module):
    """ch04/05_mla's MultiHeadLatentAttention: keys and values up-projected
    (W_UK, W_UV: latent_dim -> d_out) from a latent (W_DKV: d_in -> latent_dim,
    default max(16, d_out // 8)) that is all the cache keeps (cache_c_kv
    (b, T, latent_dim)); W_query per head, out_proj with bias, causal."""

    def __init__(self, d_in, d_out, dropout, num_heads, qkv_bias=False, latent_dim=None):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.latent_dim = latent_dim if latent_dim is not None else max(16, d_out // 8)
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_DKV = nn.Linear(d_in, self.latent_dim, bias=qkv_bias)
        self.W_UK = nn.Linear(self.latent_dim, d_out, bias=qkv_bias)
        self.W_UV = nn.Linear(self.latent_dim, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("cache_c_kv", None, persistent=False)
        self.ptr_current_pos = 0

    def reset_cache(self):
        """Empties the latent cache (the next cached call starts at position 0)."""
        self.cache_c_kv = None
        self.ptr_current_pos = 0

    def forward(self, x, use_cache=False):
        """Causal latent attention of x (b, T, d_in) -> (b, T, d_out); use_cache: x's
        latent appended to cache_c_kv, keys and values up-projected from all of it.
        A call without the cache leaves the latent cache as it is (the book's)."""
        b, T, _ = x.shape
        latent = self.W_DKV(x)  # (b, T, latent_dim)
        q_start = 0
        if use_cache:
            if self.cache_c_kv is not None:
                latent = torch.cat([self.cache_c_kv, latent], dim=1)
            self.cache_c_kv = latent
            q_start = self.ptr_current_pos
            self.ptr_current_pos += T
        else:
            self.ptr_current_pos = 0
        H = self.num_heads
        q = _heads(self.W_query(x), H)
        k = _heads(self.W_UK(latent), H)
        v = _heads(self.W_UV(latent), H)
        p = self.dropout.p if self.training else 0.0
        ctx = _sdpa(q, k, v, dropout_p=p, **_band(q_start, 0, T, k.shape[2], None))
        return self.out_proj(_merge(ctx))


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
    shortcut connections). att by the config's keys, as the book's scripts
    build it: "n_kv_groups" GroupedQueryAttention (04_gqa), "latent_dim"
    MultiHeadLatentAttention (05_mla; None: its default width),
    "sliding_window_size" MultiHeadAttentionWithSWA (06_swa; None: no window),
    else chapter 4's MultiHeadAttention."""

    def __init__(self, cfg):
        super().__init__()
        E = cfg["emb_dim"]
        if cfg.get("n_kv_groups"):
            self.att = GroupedQueryAttention(d_in=E, d_out=E, dropout=cfg["drop_rate"],
                                             num_heads=cfg["n_heads"],
                                             num_kv_groups=cfg["n_kv_groups"],
                                             qkv_bias=cfg["qkv_bias"])
        elif "latent_dim" in cfg:
            self.att = MultiHeadLatentAttention(d_in=E, d_out=E, dropout=cfg["drop_rate"],
                                                num_heads=cfg["n_heads"],
                                                qkv_bias=cfg["qkv_bias"],
                                                latent_dim=cfg["latent_dim"])
        elif "sliding_window_size" in cfg:
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

    def forward(self, x, use_cache=False):
        """x + attention(norm1(x)), then + feed-forward(norm2(x)) (shortcut dropout)."""
        x = x + self.drop_shortcut(self.att(self.norm1(x), use_cache=use_cache))
        return x + self.drop_shortcut(self.ff(self.norm2(x)))


def _uses_window(cfg, i: int) -> bool:
    """06_swa's schedule: "sliding_window_stride" K > 0 gives K windowed layers,
    then one without, and again; 0 none; < 0 all."""
    K = int(cfg["sliding_window_stride"])
    return K < 0 if K <= 0 else i % (K + 1) < K


class GPTModel(nn.Module):
    """Chapter 4's GPTModel: tok_emb, pos_emb, drop_emb, trf_blocks, final_norm,
    out_head (no bias); cfg with vocab_size, context_length, emb_dim, n_heads,
    n_layers, drop_rate, qkv_bias (GPT_CONFIG_124M's keys), and the bonus
    scripts' keys choosing the attention (TransformerBlock): n_kv_groups
    (04_gqa), latent_dim (05_mla), sliding_window_size with
    sliding_window_stride (06_swa: which layers have the window). forward(idx,
    use_cache=False): with the cache, idx's tokens continue the cached ones at
    positions current_pos, ...; reset_kv_cache() empties every layer's cache."""

    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        blocks = [TransformerBlock(cfg) for _ in range(cfg["n_layers"])]
        if "sliding_window_size" in cfg and "sliding_window_stride" in cfg:
            for i, blk in enumerate(blocks):
                blk.att.sliding_window_size = cfg["sliding_window_size"] if _uses_window(cfg, i) else None
        self.trf_blocks = nn.ModuleList(blocks)
        self.current_pos = 0
        self.final_norm = LayerNorm(cfg["emb_dim"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)

    def forward(self, in_idx, use_cache=False):  # (b, T) token ids -> (b, T, vocab_size) logits
        """The logits (b, T, vocab_size) of token ids in_idx (b, T)."""
        T = in_idx.shape[1]
        start = self.current_pos if use_cache else 0
        if use_cache:
            self.current_pos += T
        x = self.tok_emb(in_idx) + self.pos_emb(torch.arange(start, start + T, device=in_idx.device))
        x = self.drop_emb(x)
        for blk in self.trf_blocks:
            x = blk(x, use_cache=use_cache)
        return self.out_head(self.final_norm(x))

    def reset_kv_cache(self):
        """Empties every layer's cache and sets current_pos to 0."""
        for blk in self.trf_blocks:
            blk.att.reset_cache()
        self.current_pos = 0
