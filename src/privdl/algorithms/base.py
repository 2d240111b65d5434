"""Shared pieces of the decentralized algorithms: step-size schedules, gradient oracles, trees."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from privdl.comm.base import Tree
from privdl.errors import ConfigError

T = TypeVar("T")
_POOL: tuple[int, ThreadPoolExecutor] | None = None


def in_background(fn: Callable[[], T], *, device: torch.device) -> Callable[[], T]:
    """Start ``fn()`` now; return a getter for its result (exceptions re-raised there).

    For the noise of a step, which depends only on the stream keys and t, not on the gradients:
    on a CPU it is drawn in a worker thread while the caller computes the gradients, so the step
    costs about max(noise, gradients) instead of their sum; the values are the same as an inline
    call. On other devices ``fn`` runs inline (their kernels are asynchronous already).
    """
    global _POOL
    if torch.device(device).type != "cpu":
        value = fn()
        return lambda: value
    if _POOL is None or _POOL[0] != os.getpid():  # one worker per process (forks start afresh)
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="privdl-noise"))
    return _POOL[1].submit(fn).result


@dataclass(frozen=True)
class StepSize:
    """Step size ``eta_t = lr / (1 + t / decay)`` (``decay=None``: constant ``lr``).

    The DECOR reference code decays ``lr0/(1 + t/5000)`` in its NN and a9a runs without saying so
    in the paper (spec §7.14); here the schedule is always explicit.
    """

    lr: float
    decay: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"learning rate must be a positive number, got {self.lr}")
        if self.decay is not None and not (math.isfinite(self.decay) and self.decay > 0):
            raise ConfigError(f"lr decay must be positive, got {self.decay}")

    def __call__(self, t: int) -> float:
        return self.lr if self.decay is None else self.lr / (1.0 + t / self.decay)


class GradientOracle(Protocol):
    """What an algorithm asks of a task: clipped per-node gradients at step ``t``.

    The oracle samples its own minibatch for step ``t`` from a generator keyed by ``t`` (so a
    resumed run sees the same batches) and applies the clipping the algorithm asks for.
    """

    def __call__(self, params: Tree, t: int, *, clip) -> object:  # returns engine.GradResult
        ...


def tree_map(fn: Callable[..., torch.Tensor], *trees: Tree) -> Tree:
    """Apply ``fn`` leaf-wise to trees with identical keys."""
    return {k: fn(*(tr[k] for tr in trees)) for k in trees[0]}


def tree_sq_norm_per_node(tree: Tree) -> torch.Tensor:
    """Per-node squared L2 norm over every leaf (shape ``(n,)``)."""
    return sum(v.reshape(v.shape[0], -1).pow(2).sum(dim=1) for v in tree.values())


def consensus_distance(tree: Tree) -> float:
    """``(1/n) sum_i ||x_i - xbar||^2`` over all leaves."""
    total = 0.0
    for v in tree.values():
        flat = v.reshape(v.shape[0], -1)
        total += float((flat - flat.mean(dim=0, keepdim=True)).pow(2).sum(dim=1).mean())
    return total
