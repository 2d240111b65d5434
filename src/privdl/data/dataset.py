"""The ``Dataset`` record and the ``load_dataset`` registry.

Normalisation follows the papers:

* MNIST: (x/255 - 0.1307) / 0.3081 (DECOR's reference code; Robust-HDP App. B.1). PORTER does not
  state its scaling and the authors' NDA code uses x/255: use ``normalize="unit"``.
* Fashion-MNIST: Robust-HDP's code reuses the MNIST constants (0.1307, 0.3081); so do we.
* CIFAR-10: (x/255 - 0.5) / 0.5 per channel (Robust-HDP App. B.1).
* a9a: binary features, no scaling.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from privdl.data.adult import load_a9a
from privdl.data.cifar import load_cifar10_arrays, synthetic_cifar
from privdl.data.idx import load_idx_arrays
from privdl.errors import DataError

NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}
NORMALIZE_MODES = ("paper", "unit", "none")


def check_finite(x: torch.Tensor | np.ndarray, *, what: str) -> None:
    """Raise DataError when ``x`` holds NaN or Inf."""
    t = torch.as_tensor(x)
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise DataError(f"{what} contains {bad} NaN/Inf value(s)")


@dataclass(frozen=True)
class Dataset:
    """A train/test pair: float features, int64 class labels, and where the data came from.

    Labels are class indices (a9a: 0 = <=50K, 1 = >50K; use ``2*y - 1`` for the {-1,+1} form).
    ``source_note`` says what the data is (a rebuild, synthetic, the canonical files...).
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    name: str
    n_classes: int
    source_note: str

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if not x.is_floating_point():
                raise DataError(f"{self.name}: x_{split} must be a floating-point tensor")
            if x.shape[0] != y.shape[0]:
                raise DataError(f"{self.name}: x_{split} has {x.shape[0]} rows, y has {y.shape[0]}")
            check_finite(x, what=f"{self.name} x_{split}")
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.n_classes):
                raise DataError(f"{self.name}: y_{split} outside 0..{self.n_classes - 1}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example."""
        return tuple(self.x_train.shape[1:])

    def to_float64(self) -> Dataset:
        """The same data with float64 features (for oracles and closed-form checks)."""
        return replace(self, x_train=self.x_train.double(), x_test=self.x_test.double())


def _images(
    arrays: dict[str, np.ndarray], name: str, normalize: str, channels_first_shape: tuple[int, ...]
) -> dict[str, torch.Tensor]:
    if normalize not in NORMALIZE_MODES:
        raise DataError(f"normalize must be one of {NORMALIZE_MODES}, got {normalize!r}")
    out: dict[str, torch.Tensor] = {}
    for split in ("train", "test"):
        raw = np.asarray(arrays[f"x_{split}"])
        x = torch.from_numpy(raw).to(torch.float32).reshape(-1, *channels_first_shape)
        if raw.dtype == np.uint8 and normalize != "none":
            x.div_(255.0)
        if normalize == "paper" and name in NORMALIZATION:
            mean, std = (torch.tensor(v, dtype=torch.float32) for v in NORMALIZATION[name])
            x.sub_(mean[:, None, None]).div_(std[:, None, None])
        out[f"x_{split}"] = x
        out[f"y_{split}"] = torch.from_numpy(np.asarray(arrays[f"y_{split}"]).astype(np.int64))
    return out


def _load_a9a(data_dir: str | os.PathLike[str] | None, **_: object) -> Dataset:
    a = load_a9a(data_dir=data_dir)
    return Dataset(
        x_train=torch.from_numpy(a.x_train),
        y_train=torch.from_numpy(a.y01_train.astype(np.int64)),
        x_test=torch.from_numpy(a.x_test),
        y_test=torch.from_numpy(a.y01_test.astype(np.int64)),
        name="a9a",
        n_classes=2,
        source_note="a9a REBUILT from UCI Adult (CC BY 4.0, Becker & Kohavi 1996): 123 binary "
        "features, same rows and labels as LIBSVM a9a, not LIBSVM's byte-identical file",
    )


def _load_idx(name: str) -> Callable[..., Dataset]:
    def load(
        data_dir: str | os.PathLike[str] | None, *, download: bool, normalize: str, **_: object
    ) -> Dataset:
        arrays = load_idx_arrays(name, data_dir=data_dir, download=download)
        t = _images(arrays, name, normalize, (1, 28, 28))
        return Dataset(
            **t,
            name=name,
            n_classes=10,
            source_note=f"{name} canonical IDX files (SHA-256 verified), normalize={normalize}",
        )

    return load


def _load_cifar10(
    data_dir: str | os.PathLike[str] | None, *, normalize: str, **_: object
) -> Dataset:
    t = _images(load_cifar10_arrays(data_dir=data_dir), "cifar10", normalize, (3, 32, 32))
    return Dataset(
        **t,
        name="cifar10",
        n_classes=10,
        source_note=f"CIFAR-10 python batches supplied by the user, normalize={normalize}",
    )


def _load_synthetic_cifar10(
    data_dir: str | os.PathLike[str] | None,
    *,
    seed: int,
    n_train: int = 5000,
    n_test: int = 1000,
    **_: object,
) -> Dataset:
    arrays = synthetic_cifar(n_train, n_test, seed=seed)
    return Dataset(
        x_train=torch.from_numpy(arrays["x_train"]),
        y_train=torch.from_numpy(arrays["y_train"]),
        x_test=torch.from_numpy(arrays["x_test"]),
        y_test=torch.from_numpy(arrays["y_test"]),
        name="synthetic-cifar10",
        n_classes=10,
        source_note=f"SYNTHETIC 3x32x32 stand-in for CIFAR-10 (class mean patterns + Gaussian "
        f"noise, seed={seed}); not real CIFAR-10",
    )


_LOADERS: dict[str, Callable[..., Dataset]] = {
    "a9a": _load_a9a,
    "mnist": _load_idx("mnist"),
    "fashion-mnist": _load_idx("fashion-mnist"),
    "cifar10": _load_cifar10,
    "synthetic-cifar10": _load_synthetic_cifar10,
}
_ALIASES = {"adult": "a9a", "fmnist": "fashion-mnist", "cifar-10": "cifar10"}
DATASET_NAMES = tuple(sorted(set(_LOADERS) | set(_ALIASES)))


def load_dataset(
    name: str,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    seed: int = 0,
    normalize: str = "paper",
    n_train: int = 5000,
    n_test: int = 1000,
) -> Dataset:
    """Load a dataset by name: a9a (alias adult), mnist, fashion-mnist, cifar10, synthetic-cifar10.

    ``data_dir``/``download`` apply to the real datasets (see ``privdl.data.idx``); ``seed``,
    ``n_train`` and ``n_test`` to the synthetic one; ``normalize`` is "paper" (the papers'
    mean/std), "unit" (x/255) or "none" (raw 0..255 values) for real image data (a9a and the
    synthetic stand-in are used as they are).
    For DECOR's least-squares task use ``least_squares_problem``.
    """
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _LOADERS:
        raise DataError(f"unknown dataset {name!r}; expected one of {', '.join(DATASET_NAMES)}")
    if normalize not in NORMALIZE_MODES:
        raise DataError(f"normalize must be one of {NORMALIZE_MODES}, got {normalize!r}")
    return _LOADERS[key](
        data_dir,
        download=download,
        seed=seed,
        normalize=normalize,
        n_train=n_train,
        n_test=n_test,
    )
