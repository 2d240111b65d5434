"""Paper reproductions: presets as data (``privdl/presets/*.toml``), runners, reports.

Every module in this package may define ``REPRODUCTIONS``, a list of :class:`Reproduction`;
they are discovered automatically, so adding a reproduction touches no shared file.
Each reproduction writes ``report.md``, its PNG figures and ``summary.json`` into its output
directory, with the paper's values or expected orderings beside ours.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privdl.errors import ConfigError
from privdl.records import write_json_atomic


@dataclass(frozen=True)
class Reproduction:
    """One paper figure or table.

    ``run(out_dir, quick=...)`` does the work and returns the summary it wrote. ``quick`` is a
    CI-sized version (minutes on 2 cores at most); the full version is documented with its
    run time in ``full_runtime``.
    """

    name: str
    paper: str
    description: str
    run: Callable[..., dict[str, Any]]
    full_runtime: str = "unknown"


def registry() -> dict[str, Reproduction]:
    """All reproductions, by name, from every module of this package."""
    found: dict[str, Reproduction] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for rep in getattr(module, "REPRODUCTIONS", ()):
            if rep.name in found:
                raise RuntimeError(f"duplicate reproduction name {rep.name!r}")
            found[rep.name] = rep
    return dict(sorted(found.items()))


def get(name: str) -> Reproduction:
    reps = registry()
    if name not in reps:
        raise ConfigError(
            f"unknown reproduction {name!r}; `privdl reproduce --list` shows: {', '.join(reps)}"
        )
    return reps[name]


def load_preset(name: str) -> dict[str, Any]:
    """Read ``privdl/presets/NAME.toml`` (shipped with the package)."""
    import tomllib
    from importlib import resources

    path = resources.files("privdl") / "presets" / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"preset {name!r} not found")
    return tomllib.loads(path.read_text())


def write_outputs(out: Path, *, report_md: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Write ``report.md`` and ``summary.json`` (figures are saved by the caller into ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report_md)
    write_json_atomic(out / "summary.json", summary)
    return summary


def cells_dir(out_dir: Path, *, resume: bool) -> Path:
    """``out_dir/cells``, where a grid keeps one file per finished run for ``--resume``; without
    ``resume`` a folder that already holds cells is refused (nothing is overwritten)."""
    cells = Path(out_dir) / "cells"
    if not resume and cells.is_dir() and any(cells.iterdir()):
        raise ConfigError(
            f"{out_dir} holds cells of an earlier run: pass --resume to continue it, or "
            "--out DIR for a new one"
        )
    cells.mkdir(parents=True, exist_ok=True)
    return cells


class RunCells:
    """Finished runs of a grid (DECOR's cells, the seeds of PORTER and the PrivSGP-VR sweeps),
    one JSON file each under ``out_dir/cells`` (named by a hash of the run's full configuration,
    which the file also keeps), so ``privdl reproduce NAME --resume`` continues a grid that was
    cut off and trains only the runs it had not finished.

    Without ``resume`` a folder that already holds cells is refused (nothing is overwritten). A
    cell keeps the run's JSON results (the keys not starting with ``_``).
    """

    def __init__(self, out_dir: Path, *, resume: bool) -> None:
        self.dir = cells_dir(out_dir, resume=resume)
        self.kept = 0  # cells reused from an earlier run (reported in the summary)

    def path(self, key: dict[str, Any]) -> Path:
        blob = json.dumps(key, sort_keys=True, default=str).encode()
        return self.dir / f"{hashlib.sha256(blob).hexdigest()[:20]}.json"

    def run(self, key: dict[str, Any], compute) -> dict[str, Any]:
        """The run's results: from its cell, or ``compute()`` now and saved as a cell."""
        path = self.path(key)
        if path.exists():
            blob = json.loads(path.read_text())
            if blob.get("key") == json.loads(json.dumps(key, default=str)):
                self.kept += 1
                return blob["result"]
        result = compute()
        kept = {k: v for k, v in result.items() if not k.startswith("_")}
        write_json_atomic(path, {"key": key, "result": kept})
        return kept


def apply_overrides(
    values: dict[str, Any], overrides: dict[str, str] | None, *, name: str
) -> dict[str, Any]:
    """``values`` with ``--set KEY=VALUE`` overrides, each parsed as the value it replaces.

    Lists take comma-separated items (``--set seeds=1,2``; empty: no items); a key not in ``values`` or a value
    of the wrong type is a one-line :class:`ConfigError` naming the accepted keys.
    """
    out = dict(values)
    for key, raw in (overrides or {}).items():
        if key not in out or isinstance(out[key], dict):
            known = ", ".join(sorted(k for k, v in out.items() if not isinstance(v, dict)))
            raise ConfigError(f"unknown setting {key!r} for {name}; known: {known}")
        out[key] = parse_like(key, raw, out[key])
    return out


def parse_like(key: str, raw: Any, like: Any) -> Any:
    """Parse the string ``raw`` as the type of ``like`` (bool, int, float, list of those, str)."""
    if not isinstance(raw, str):
        return raw
    try:
        if isinstance(like, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if isinstance(like, int):
            return int(raw)
        if isinstance(like, float):
            return float(raw)
        if isinstance(like, list):  # "a,b" -> [a, b]; "" -> [] (e.g. --set legacy_epsilons=)
            items = [v.strip() for v in raw.split(",")] if raw.strip() else []
            return [parse_like(key, v, like[0] if like else v) for v in items]
    except ValueError:
        if isinstance(like, list):
            kind = type(like[0]).__name__ if like else "value"
            raise ConfigError(
                f"--set {key}={raw}: expected comma-separated {kind} values (e.g. {key}=1,2)"
            ) from None
        raise ConfigError(f"--set {key}={raw}: expected a {type(like).__name__}") from None
    return raw
