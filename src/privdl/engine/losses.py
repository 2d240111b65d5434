"""Per-sample losses for stacked outputs: ``(n, B, ...)`` outputs and ``(n, B)`` labels to
``(n, B)`` losses."""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from privdl.errors import ConfigError

LossName = Literal["cross_entropy", "bce", "mse"]
LOSSES = ("cross_entropy", "bce", "mse")


def check_loss(loss: str) -> None:
    if loss not in LOSSES:
        raise ConfigError(f"unknown loss {loss!r}; choose from {', '.join(LOSSES)}")


def per_sample_loss(out: Tensor, y: Tensor, loss: str) -> Tensor:
    """Loss of every sample of every node.

    * ``cross_entropy``: softmax cross-entropy, ``out (n, B, K)``, integer labels ``y (n, B)``;
    * ``bce``: binary cross-entropy on one logit, ``out (n, B, 1)`` or ``(n, B)``, labels 0/1
      (DECOR/PORTER a9a: logistic loss ``log(1 + exp(-l x^T f))`` with ``l = 2y - 1``);
    * ``mse``: mean over output entries of ``(out - y)^2`` (torch's ``MSELoss`` per sample).
    """
    n, b = out.shape[:2]
    if loss == "cross_entropy":
        flat = out.reshape(n * b, -1)
        return F.cross_entropy(flat, y.reshape(n * b).long(), reduction="none").reshape(n, b)
    if loss == "bce":
        logit = out.reshape(n, b)
        return F.binary_cross_entropy_with_logits(logit, y.to(logit.dtype), reduction="none")
    if loss == "mse":
        pred = out.reshape(n, b, -1)
        target = y.to(pred.dtype).reshape(n, b, -1)
        return (pred - target).pow(2).mean(dim=2)
    check_loss(loss)
    raise AssertionError  # unreachable


def correct(out: Tensor, y: Tensor, loss: str) -> Tensor:
    """Per-sample 0/1 correctness (argmax for cross-entropy, sign of the logit for BCE)."""
    n, b = out.shape[:2]
    if loss == "cross_entropy":
        return (out.reshape(n, b, -1).argmax(dim=2) == y.long()).to(out.dtype)
    if loss == "bce":
        return ((out.reshape(n, b) > 0) == (y > 0.5)).to(out.dtype)
    return out.new_full((n, b), float("nan"))
