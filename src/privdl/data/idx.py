"""MNIST and Fashion-MNIST: IDX reader, SHA-256 verification, lookup and optional download.

Used by DECOR Fig 1c (s.6.2), PORTER Fig 3 (s.5.2), PrivSGP-VR Appendix E and Robust-HDP
(App. B.1). Files are looked up in ``data_dir``, then ``$PRIVDL_DATA_DIR``, then the cache directory
(``$XDG_CACHE_HOME/privdl`` or ``~/.cache/privdl``), as ``DIR/<name>/<file>`` or ``DIR/<file>``,
gzip or plain. Missing files are downloaded from the canonical mirror into the cache when
``download`` is true and ``$PRIVDL_OFFLINE`` is unset; otherwise DataError says what is missing,
where we looked and how to supply the files. Contents are always checked against SHA-256.
"""

from __future__ import annotations

import gzip
import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np

from privdl.data._files import (
    ENV_DATA_DIR,
    cache_dir,
    find_file,
    offline,
    read_bytes,
    search_dirs,
    sha256_hex,
    verify_sha256,
)
from privdl.errors import DataError

IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

# SHA-256 of the uncompressed canonical files.
IDX_SHA256: dict[str, dict[str, str]] = {
    "mnist": {
        "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
}

# Canonical mirrors serving ``<file>.gz``.
MIRRORS: dict[str, tuple[str, ...]] = {
    "mnist": (
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://yann.lecun.com/exdb/mnist/",
    ),
    "fashion-mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
}

CONNECT_TIMEOUT_S = 10.0

# IDX type codes (byte 3 of the magic number) -> numpy big-endian dtype.
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

Fetcher = Callable[[str, float], bytes]


def parse_idx(data: bytes, *, source: str = "IDX data") -> np.ndarray:
    """Decode IDX bytes: magic 0x0000 <type> <ndim>, ndim big-endian uint32 dims, then the data.

    Raises DataError on a bad magic number, an unknown type code or a size mismatch.
    """
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DataError(f"{source} is not an IDX file (bad magic number)")
    type_code, ndim = data[2], data[3]
    if type_code not in _IDX_DTYPES:
        raise DataError(f"{source}: unknown IDX type code 0x{type_code:02x}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{source}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[type_code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise DataError(
            f"{source}: IDX payload has {len(data) - header} bytes, dims {dims} need {expected}"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (``.gz`` or plain) without hash verification."""
    p = Path(path)
    return parse_idx(read_bytes(p), source=str(p))


def _urllib_fetch(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def _download(name: str, filename: str, fetch: Fetcher) -> bytes | None:
    """Try each mirror; return verified uncompressed contents and cache them, or None."""
    expected = IDX_SHA256[name][filename]
    for mirror in MIRRORS[name]:
        try:
            blob = fetch(mirror + filename + ".gz", CONNECT_TIMEOUT_S)
            data = gzip.decompress(blob)
        except (OSError, EOFError, urllib.error.URLError, http.client.HTTPException, ValueError):
            continue
        if sha256_hex(data) != expected:
            continue
        target = cache_dir() / name / (filename + ".gz")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".gz.part")
            with gzip.open(tmp, "wb") as fh:
                fh.write(data)
            tmp.replace(target)
        except OSError:
            pass  # caching is best effort; the data itself is verified
        return data
    return None


def load_idx_arrays(
    name: str,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    fetch: Fetcher | None = None,
) -> dict[str, np.ndarray]:
    """Load the four verified IDX arrays of ``name`` ("mnist" or "fashion-mnist").

    Returns ``{"x_train": uint8 (60000, 28, 28), "y_train": uint8 (60000,), "x_test", "y_test"}``.
    ``fetch(url, timeout) -> bytes`` replaces the HTTP client (tests inject one; never a network).
    """
    if name not in IDX_SHA256:
        raise DataError(f"unknown IDX dataset {name!r}; expected one of {sorted(IDX_SHA256)}")
    dirs = search_dirs(data_dir)
    may_download = download and not offline()
    contents: dict[str, bytes] = {}
    missing: list[str] = []
    data: bytes | None
    for filename in IDX_FILES:
        path = find_file(dirs, name, filename)
        if path is not None:
            data = read_bytes(path)
            verify_sha256(data, IDX_SHA256[name][filename], what=str(path))
            contents[filename] = data
            continue
        data = _download(name, filename, fetch or _urllib_fetch) if may_download else None
        if data is None:
            missing.append(filename)
        else:
            contents[filename] = data
    if missing:
        looked = ", ".join(f"{d}/{name}/ and {d}/" for d in dirs)
        why = "download failed" if may_download else "download disabled"
        raise DataError(
            f"{name}: missing {', '.join(f + '(.gz)' for f in missing)}; looked in {looked}; "
            f"{why}; supply them with --data-dir DIR or {ENV_DATA_DIR}=DIR "
            f"(DIR/{name}/<file>.gz), or allow a download from {MIRRORS[name][0]}"
        )
    arrays = {
        key: parse_idx(contents[f], source=f"{name}/{f}")
        for key, f in zip(("x_train", "y_train", "x_test", "y_test"), IDX_FILES, strict=True)
    }
    for split in ("train", "test"):
        if arrays[f"x_{split}"].shape[0] != arrays[f"y_{split}"].shape[0]:
            raise DataError(f"{name}: {split} images and labels differ in count")
    return arrays
