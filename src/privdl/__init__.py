"""privdl: differentially private decentralized and federated learning.

The one-call facade (what ``privdl run`` does, from Python)::

    import privdl

    summary = privdl.train(
        algorithm="decor", task="a9a", graph="torus:4x4", clip=1.0,
        epsilon=3.0, delta=1e-5, steps=500, out="runs/decor",
    )
    summary["final"]["privacy"]  # epsilon with its accountant, delta, unit and threat model
    privdl.resume("runs/decor")  # continue a cut-off run from its checkpoint

The composable parts live in the sub-packages: ``privdl.topology``, ``privdl.engine``,
``privdl.mechanisms``, ``privdl.accounting``, ``privdl.algorithms``, ``privdl.robust``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from privdl.errors import PrivdlError

__version__ = "0.1.0"
__all__ = ["PrivdlError", "__version__", "resume", "train"]


def train(
    *,
    out: str | Path,
    config: str | Path | None = None,
    progress: bool | None = None,
    overwrite: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Validate, calibrate, train and record one run; returns its ``summary.json`` as a dict.

    Args:
        out: the run's output directory (config, environment, append-only metrics, checkpoint,
            summary).
        config: an optional TOML file of options (a ``[run]`` table, or top-level keys); the
            keyword ``options`` override it.
        progress: a progress bar on stderr; ``None`` shows one only on a terminal.
        overwrite: replace an earlier run in ``out`` (otherwise that is refused).
        **options: the keys of :class:`privdl.config.RunConfig`, e.g. ``algorithm``, ``task``,
            ``graph``, ``clip``, ``epsilon``, ``delta``, ``steps`` (the same as the CLI's flags).
            An unknown key or an invalid value raises :class:`privdl.errors.ConfigError`.
    """
    from privdl.config import load_config_file, make_config
    from privdl.runner import train as train_config

    values = load_config_file(config) if config is not None else {}
    cfg = make_config({**values, **options})
    return train_config(cfg, out, progress=progress, overwrite=overwrite)


def resume(out: str | Path, *, progress: bool | None = None) -> dict[str, Any]:
    """Continue the run in ``out`` from its last checkpoint; returns its summary."""
    from privdl.runner import resume as resume_run

    return resume_run(out, progress=progress)
