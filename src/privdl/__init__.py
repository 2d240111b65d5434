"""privdl: differentially private decentralized and federated learning.

The one-call facade (what ``privdl run`` does, from Python), with names or your own objects::

    import privdl

    result = privdl.train(
        algorithm="decor", model=net, data=(X, y), graph="torus:4x4", clip=1.0,
        epsilon=3.0, delta=1e-5, steps=500, out="runs/decor",
    )
    result.model                 # the trained (averaged) model, an nn.Module
    result.privacy               # epsilon with its accountant, delta, unit and threat model
    privdl.resume("runs/decor", model=net, data=(X, y))  # continue a cut-off run

``privdl.list_algorithms()`` lists what can run; ``privdl.register(name, recipe)`` adds an algorithm
(docs/adding-an-algorithm.md). The composable parts live in the sub-packages:
``privdl.topology``, ``privdl.engine``, ``privdl.mechanisms``, ``privdl.accounting``,
``privdl.algorithms``, ``privdl.recipes``, ``privdl.robust``.
"""

from __future__ import annotations

from typing import Any

from privdl.errors import PrivdlError

__version__ = "0.1.0"  # the one source of the version (pyproject.toml reads it)
__all__ = [
    "PrivdlError",
    "TrainResult",
    "__version__",
    "list_algorithms",
    "register",
    "resume",
    "train",
]

#: Public names imported on first use, so ``import privdl`` (and the CLI's start) stays light.
_LAZY = {
    "train": "privdl.api",
    "resume": "privdl.api",
    "TrainResult": "privdl.api",
    "register": "privdl.registry",
    "list_algorithms": "privdl.registry",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'privdl' has no attribute {name!r}")
