"""Clipping of stacked gradients (pure functions).

* hard (DECOR Alg. 1 line 2; Robust-HDP / DP-SGD): ``Clip(g; C) = min{1, C/||g||_2} g``;
* smooth (PORTER Definition 2, Fig. 1): ``Clip_tau(g) = tau g / (tau + ||g||_2)``, whose norm
  ``tau ||g|| / (tau + ||g||)`` stays below ``tau``.

A "stacked gradient" is a dict of tensors whose leading dimension indexes nodes; its per-node
global norm is the L2 norm of node ``i``'s whole flattened gradient.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from privdl.errors import PrivacyError

ClipKind = Literal["hard", "smooth"]


def global_norm(grads: dict[str, Tensor]) -> Tensor:
    """Per-node L2 norm of a stacked gradient dict: shape ``(n,)``."""
    sq = [g.reshape(g.shape[0], -1).pow(2).sum(dim=1) for g in grads.values()]
    return torch.stack(sq).sum(dim=0).sqrt()


def clip_factor(
    norms: Tensor, threshold: float, *, kind: ClipKind = "hard", scale: float | Tensor = 1.0
) -> Tensor:
    """Scale factor ``c`` with ``clip(g) = c g`` for gradients of norm ``norms`` (any shape),
    times ``scale`` (fused, to save kernel launches).

    hard: ``min(1, C/||g||) = C / max(||g||, C)`` (1 where ``||g|| = 0``);
    smooth: ``C / (C + ||g||)``.
    """
    if threshold is None or not threshold > 0:
        raise PrivacyError(f"clipping threshold must be > 0, got {threshold}")
    if kind == "hard":
        inv = norms.clamp_min(threshold).reciprocal_()
    elif kind == "smooth":
        inv = (norms + threshold).reciprocal_()
    else:
        raise PrivacyError(f"unknown clipping kind {kind!r}; choose 'hard' or 'smooth'")
    if isinstance(scale, Tensor):
        return inv.mul_(scale).mul_(threshold)
    return inv.mul_(threshold * scale)


def clip_by_global_norm(
    grads: dict[str, Tensor], threshold: float, *, kind: ClipKind = "hard"
) -> dict[str, Tensor]:
    """Clip each node's gradient by its global norm (e.g. DECOR user-level clipping of the
    batch-mean gradient, PORTER's smooth clip of its gradient estimate)."""
    c = clip_factor(global_norm(grads), threshold, kind=kind)
    return {k: g * c.reshape(-1, *([1] * (g.dim() - 1))) for k, g in grads.items()}
