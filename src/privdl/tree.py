"""Trees of tensors: the one place that flattens, splits and measures node state.

A tree is a ``dict[str, Tensor]`` (parameter name -> tensor). A *node-stacked* tree has the nodes a
process owns as the leading dimension of every leaf: ``(n, *shape)`` (DESIGN.md, "Node state").
Algorithms work on flat ``(n, P)`` views where a step is a matrix operation (PORTER's surrogates,
PrivSGP-VR's SAGA table, Robust-HDP's update matrix M) and on trees where the model needs names.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

Tree = dict[str, torch.Tensor]

__all__ = [
    "Tree",
    "consensus_distance",
    "flatten",
    "flatten_one",
    "sq_norm_per_node",
    "tree_map",
    "unflatten",
    "unflatten_one",
]


def tree_map(fn: Callable[..., torch.Tensor], *trees: Tree) -> Tree:
    """Apply ``fn`` leaf-wise to trees with identical keys (in the first tree's order)."""
    return {k: fn(*(tr[k] for tr in trees)) for k in trees[0]}


def flatten(tree: Tree) -> torch.Tensor:
    """A node-stacked tree as one ``(n, P)`` matrix, leaves concatenated in the tree's order."""
    return torch.cat([v.reshape(v.shape[0], -1) for v in tree.values()], dim=1)


def unflatten(flat: torch.Tensor, like: Tree) -> Tree:
    """Split ``(n, P)`` into a tree shaped like the node-stacked ``like`` (views, no copy)."""
    sizes = [math.prod(v.shape[1:]) for v in like.values()]
    parts = torch.split(flat, sizes, dim=1)  # one call for every leaf's column range
    n = flat.shape[0]
    return {
        name: part.reshape(n, *v.shape[1:])
        for (name, v), part in zip(like.items(), parts, strict=True)
    }


def flatten_one(tree: Tree) -> torch.Tensor:
    """One model's tree (no node dimension) as a vector ``(P,)``."""
    return torch.cat([v.reshape(-1) for v in tree.values()])


def unflatten_one(flat: torch.Tensor, like: Tree) -> Tree:
    """Split ``(P,)`` into a tree shaped like the one-model ``like``."""
    out, start = {}, 0
    for name, v in like.items():
        out[name] = flat[start : start + v.numel()].reshape(v.shape)
        start += v.numel()
    return out


def sq_norm_per_node(tree: Tree) -> torch.Tensor:
    """Per-node squared L2 norm over every leaf (shape ``(n,)``)."""
    return sum(v.reshape(v.shape[0], -1).pow(2).sum(dim=1) for v in tree.values())  # type: ignore[return-value]


def consensus_distance(tree: Tree) -> float:
    """``(1/n) sum_i ||x_i - xbar||^2`` over all leaves (DECOR's consensus measure)."""
    total = 0.0
    for v in tree.values():
        flat = v.reshape(v.shape[0], -1)
        total += float((flat - flat.mean(dim=0, keepdim=True)).pow(2).sum(dim=1).mean())
    return total
