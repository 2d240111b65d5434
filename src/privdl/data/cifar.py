"""CIFAR-10: reader for user-supplied ``cifar-10-batches-py`` pickles, and a synthetic stand-in.

CIFAR-10 is used by PrivSGP-VR (s.5, ResNet-18) and Robust-HDP (App. B.1, Appendix G). No package
ships it and nothing here downloads it: users point ``data_dir`` (or ``$PRIVDL_DATA_DIR``) at a
folder holding ``cifar-10-batches-py/`` (or the batch files themselves). Pickles are decoded with a
restricted unpickler that only builds numpy arrays, lists and plain values, so a hostile file
cannot run code.

``synthetic_cifar`` is a SYNTHETIC 3x32x32 stand-in with learnable class structure for tests and
CI-sized runs; its numbers say nothing about real CIFAR-10 accuracy.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np

from privdl.data._files import ENV_DATA_DIR, search_dirs
from privdl.errors import DataError

CIFAR_SUBDIR = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{k}" for k in range(1, 6))
TEST_BATCH = "test_batch"
IMAGE_SHAPE = (3, 32, 32)

_ALLOWED_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
    ("copy_reg", "_reconstructor"),
    ("copyreg", "_reconstructor"),
    ("__builtin__", "object"),
    ("builtins", "object"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the globals numpy arrays need."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")


def read_cifar_batch(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 python batch: dict with ``b'data'`` uint8 (N, 3072) and ``b'labels'``.

    Returns images uint8 (N, 3, 32, 32) (channel-major, as stored) and labels int64 (N,).
    Malformed files raise DataError.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
        obj = _RestrictedUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, IndexError) as exc:
        raise DataError(f"cannot read CIFAR batch {p}: {exc}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{p}: a CIFAR batch must be a dict, got {type(obj).__name__}")
    data = obj.get(b"data", obj.get("data"))
    labels = obj.get(b"labels", obj.get("labels"))
    if data is None or labels is None:
        raise DataError(f"{p}: CIFAR batch lacks 'data' or 'labels'")
    data = np.asarray(data)
    labels = np.asarray(labels)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(
            f"{p}: 'data' must be uint8 of shape (N, 3072), got {data.dtype} {data.shape}"
        )
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise DataError(f"{p}: 'labels' must have one entry per image")
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{p}: CIFAR-10 labels must lie in 0..9")
    return data.reshape(-1, *IMAGE_SHAPE), labels


def _find_cifar_dir(data_dir: str | os.PathLike[str] | None) -> tuple[Path | None, list[Path]]:
    looked: list[Path] = []
    for base in search_dirs(data_dir):
        for cand in (base / CIFAR_SUBDIR, base / "cifar10" / CIFAR_SUBDIR, base):
            looked.append(cand)
            if (cand / TEST_BATCH).is_file():
                return cand, looked
    return None, looked


def load_cifar10_arrays(*, data_dir: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """Load CIFAR-10 from user-supplied pickles: x uint8 (N, 3, 32, 32), y int64.

    Looks for ``cifar-10-batches-py/`` (or the batch files directly) in ``data_dir``, then
    ``$PRIVDL_DATA_DIR``, then the cache directory. Training batches that are absent are an
    error (all five are required).
    """
    folder, looked = _find_cifar_dir(data_dir)
    if folder is None:
        raise DataError(
            f"CIFAR-10 not found: no {TEST_BATCH} in {', '.join(map(str, looked))}; download "
            f"cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, unpack it and "
            f"pass --data-dir DIR or set {ENV_DATA_DIR}=DIR (DIR/{CIFAR_SUBDIR}/)"
        )
    missing = [b for b in TRAIN_BATCHES if not (folder / b).is_file()]
    if missing:
        raise DataError(f"CIFAR-10 in {folder} lacks {', '.join(missing)}")
    parts = [read_cifar_batch(folder / b) for b in TRAIN_BATCHES]
    x_test, y_test = read_cifar_batch(folder / TEST_BATCH)
    return {
        "x_train": np.concatenate([p[0] for p in parts]),
        "y_train": np.concatenate([p[1] for p in parts]),
        "x_test": x_test,
        "y_test": y_test,
    }


def synthetic_cifar(
    n_train: int,
    n_test: int,
    *,
    seed: int,
    n_classes: int = 10,
    noise: float = 1.0,
) -> dict[str, np.ndarray]:
    """SYNTHETIC CIFAR-10 stand-in: float32 images (N, 3, 32, 32), labels int64.

    Class c has a fixed smooth mean pattern mu_c (low-frequency random image, unit RMS); an image
    is mu_y + noise * N(0, I). Labels are uniform. Train and test share the class means, so a
    model can learn the task; with ``noise=1`` a linear classifier separates the classes well.
    """
    if n_train < 0 or n_test < 0 or n_classes < 2 or noise < 0:
        raise DataError("synthetic_cifar needs n_train, n_test >= 0, n_classes >= 2, noise >= 0")
    rng = np.random.default_rng(seed)
    coarse = rng.standard_normal((n_classes, 3, 4, 4))
    means = np.repeat(np.repeat(coarse, 8, axis=2), 8, axis=3)  # 4x4 blocks -> 32x32
    means /= np.sqrt((means**2).mean(axis=(1, 2, 3), keepdims=True))
    out: dict[str, np.ndarray] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = rng.integers(0, n_classes, size=n)
        x = means[y] + noise * rng.standard_normal((n, *IMAGE_SHAPE))
        out[f"x_{split}"] = x.astype(np.float32)
        out[f"y_{split}"] = y.astype(np.int64)
    return out
