"""Self-attention as privdl layers (transformer encoders on the ghost path).

``torch.nn.MultiheadAttention`` used as self-attention (query, key and value the same tensor,
``batch_first=True``) is three steps: the input projection, a Linear at every position
(``z = a W_in^T + b_in`` with ``W_in (3 D, D)``: :class:`InProjection`, which keeps the module's
parameter names ``in_proj_weight``/``in_proj_bias``), the parameter-free attention of every
head (:class:`SelfAttention`: ``softmax(Q K^T / sqrt(d)) V`` per sample, Vaswani et al. 2017,
eq. (1)), and the output projection (a :class:`~privdl.models.base.Linear`). Only the two
projections have parameters, and both are Linear layers over a sample's positions, so the
per-sample clipping engine clips them without per-sample gradients (docs/engine.md,
"Transformers"); the attention mixes positions within a sample, never samples.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from privdl.errors import ConfigError
from privdl.models.base import Layer, Linear

__all__ = ["InProjection", "SelfAttention"]


class InProjection(Linear):
    """The query/key/value projection of ``nn.MultiheadAttention``: a :class:`Linear` from ``D``
    to ``3 D`` features whose parameters keep the module's names (``<name>.in_proj_weight``,
    ``<name>.in_proj_bias``)."""

    def __init__(self, embed_dim: int, *, bias: bool = True) -> None:
        super().__init__(embed_dim, 3 * embed_dim, bias=bias)

    def param_key(self, name: str, key: str) -> str:
        return f"{name}.in_proj_{key}"


class SelfAttention(Layer):
    """Scaled dot-product attention of ``num_heads`` heads over a sample's positions: input
    ``(n, B, T, 3 D)`` (the queries, keys and values side by side, as ``nn.MultiheadAttention``
    packs them), output ``(n, B, T, D)``, the heads concatenated. ``causal`` masks the later
    positions (``is_causal``); ``padding_idx`` masks the keys where the model's input tokens hold
    it (``key_padding_mask=x == padding_idx``), read from a second input."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        causal: bool = False,
        padding_idx: int | None = None,
    ) -> None:
        if embed_dim < 1 or num_heads < 1 or embed_dim % num_heads:
            raise ConfigError(
                f"SelfAttention: embed_dim {embed_dim} must be a positive multiple of "
                f"num_heads {num_heads}"
            )
        self.embed_dim, self.num_heads, self.causal = embed_dim, num_heads, causal
        self.padding_idx = padding_idx

    def out_shape(self, in_shape):
        if len(in_shape) != 2 or in_shape[1] != 3 * self.embed_dim:
            raise ConfigError(
                f"SelfAttention({self.embed_dim}, {self.num_heads}) on samples of shape "
                f"{tuple(in_shape)}: expected (positions, {3 * self.embed_dim})"
            )
        return (in_shape[0], self.embed_dim)

    def forward(self, params, a: Tensor, tokens: Tensor | None = None) -> Tensor:
        """``tokens (n, B, T)``: with ``padding_idx``, the model's input, whose positions holding
        ``padding_idx`` no query attends to (``key_padding_mask=tokens == padding_idx``)."""
        *lead, length, _ = a.shape
        h, d = self.num_heads, self.embed_dim // self.num_heads
        # (..., T, 3, H, d) -> three (..., H, T, d)
        qkv = a.reshape(*lead, length, 3, h, d).movedim(-3, 0).transpose(-3, -2)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q * (1.0 / math.sqrt(d)), k.transpose(-2, -1))  # (..., H, T, T)
        if self.causal:
            later = torch.ones(length, length, dtype=torch.bool, device=a.device).triu(1)
            scores = scores.masked_fill(later, float("-inf"))
        if self.padding_idx is not None:
            if tokens is None:
                raise ConfigError("SelfAttention with a padding_idx needs the tokens")
            padded = (tokens == self.padding_idx).reshape(*lead, 1, 1, length)
            scores = scores.masked_fill(padded, float("-inf"))
        out = torch.matmul(scores.softmax(-1), v)  # (..., H, T, d)
        return out.transpose(-3, -2).reshape(*lead, length, self.embed_dim)
