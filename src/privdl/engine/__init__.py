"""The vectorized engine: per-node gradients (clipped per sample, on the batch mean, or not at
all) for every node at once, and evaluation of stacked models."""

from privdl.engine.allocator import tune_allocator
from privdl.engine.clipping import clip_by_global_norm, clip_factor, global_norm
from privdl.engine.grads import ClipSpec, GradResult, evaluate, node_gradients
from privdl.engine.losses import per_sample_loss

__all__ = [
    "ClipSpec",
    "GradResult",
    "clip_by_global_norm",
    "clip_factor",
    "evaluate",
    "global_norm",
    "node_gradients",
    "per_sample_loss",
    "tune_allocator",
]
