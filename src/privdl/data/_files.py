"""File lookup and integrity helpers shared by the real-data loaders.

Lookup order for every real dataset (issue 2): an explicit ``data_dir`` argument, then the
``PRIVDL_DATA_DIR`` environment variable, then the user cache directory
(``$XDG_CACHE_HOME/privdl`` or ``~/.cache/privdl``). Inside a directory both ``DIR/<sub>/<file>``
and ``DIR/<file>`` are accepted, gzip-compressed (``.gz``) or plain.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from privdl.errors import DataError

ENV_DATA_DIR = "PRIVDL_DATA_DIR"
ENV_OFFLINE = "PRIVDL_OFFLINE"


def cache_dir() -> Path:
    """Return the per-user cache directory for downloaded datasets (not created here)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "privdl"


def search_dirs(data_dir: str | os.PathLike[str] | None) -> list[Path]:
    """Directories searched, in order: ``data_dir``, ``$PRIVDL_DATA_DIR``, the cache directory."""
    dirs: list[Path] = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    env = os.environ.get(ENV_DATA_DIR)
    if env:
        dirs.append(Path(env).expanduser())
    dirs.append(cache_dir())
    return dirs


def candidate_paths(directory: Path, subdir: str, filename: str) -> list[Path]:
    """Every accepted location of ``filename`` inside ``directory`` (plain first, then ``.gz``)."""
    return [
        directory / subdir / filename,
        directory / subdir / (filename + ".gz"),
        directory / filename,
        directory / (filename + ".gz"),
    ]


def find_file(dirs: Sequence[Path], subdir: str, filename: str) -> Path | None:
    """Return the first existing accepted location of ``filename`` in ``dirs``, else None."""
    for directory in dirs:
        for path in candidate_paths(directory, subdir, filename):
            if path.is_file():
                return path
    return None


def read_bytes(path: Path) -> bytes:
    """Read a file, transparently decompressing ``.gz``; corrupt gzip raises DataError."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None


def sha256_hex(data: bytes) -> str:
    """SHA-256 of the (uncompressed) contents."""
    return hashlib.sha256(data).hexdigest()


def verify_sha256(data: bytes, expected: str, *, what: str) -> None:
    """Raise DataError when ``data`` does not hash to ``expected``."""
    got = sha256_hex(data)
    if got != expected:
        raise DataError(
            f"{what} is corrupt or not the canonical file: SHA-256 {got[:16]}... != "
            f"expected {expected[:16]}...; delete it and supply the original file"
        )


def offline() -> bool:
    """True when ``PRIVDL_OFFLINE`` is set to a true value (disables every download)."""
    return os.environ.get(ENV_OFFLINE, "").strip().lower() in {"1", "true", "yes", "on"}
