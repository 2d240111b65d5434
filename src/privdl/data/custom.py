"""Bring your own data: turn what a user already holds into a :class:`Dataset` (plus node split).

People arrive with data in the form their current tooling uses, so :func:`user_data` accepts:

* ``(X, y)`` — torch tensors or numpy arrays, ``X`` of shape (N, *input_shape), ``y`` integer
  class labels of shape (N,). This is what Opacus / plain PyTorch users have in memory.
* a map-style ``torch.utils.data.Dataset`` (``len()`` and ``ds[i] -> (x, y)``), e.g. a
  ``TensorDataset`` or a torchvision dataset with a ``ToTensor`` transform. It is read once and
  stacked, because the engine keeps every node's data in one padded tensor. An
  ``IterableDataset`` is refused: it cannot be partitioned or stacked without being read whole.
* a list of per-node datasets, each an ``(X, y)`` pair or a torch Dataset — the per-client data
  Flower (and other federated) users already have. They are concatenated and ``UserData.parts``
  records which rows belong to which node, so the run uses the user's split instead of
  partitioning.

``eval_data`` takes the first two forms; without it the test split is the training data (the
``source_note`` says so). Integer/bool features become float32 (no rescaling: normalise first),
float64 stays float64 (the task casts to the run's dtype); labels become int64.
:func:`partition_parts` is the partitioning ``SupervisedTask`` applies when no split is given.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np
import torch
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import IterableDataset, TensorDataset

from privdl.data.dataset import Dataset, check_finite
from privdl.data.partition import partition_dirichlet, partition_iid, partition_shards
from privdl.errors import ConfigError, DataError

_ARRAYS = (torch.Tensor, np.ndarray)
_FORMS = "an (X, y) pair of torch tensors / numpy arrays or a map-style torch Dataset"


@dataclass(frozen=True, eq=False)
class UserData:
    """User-supplied data, normalised.

    ``dataset``: train = the user's training examples, test = ``eval_data`` (or the training
    examples, noted in ``source_note``). ``parts``: per-node index arrays into ``x_train`` when
    the user gave per-node data, else None (partition with the run's partitioner).
    ``fingerprint``: SHA-256 over n_classes and the shapes, dtypes and bytes of x/y (train and
    test) and of the parts; a resumed run checks it with :meth:`check_fingerprint`.
    """

    dataset: Dataset
    parts: list[np.ndarray] | None = field(default=None, repr=False)
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        if self.parts is not None:
            n = self.dataset.x_train.shape[0]
            parts = [np.asarray(p, dtype=np.int64).reshape(-1) for p in self.parts]
            if not parts:
                raise DataError("parts must hold at least one node")
            for i, p in enumerate(parts):
                if p.size == 0:
                    raise DataError(f"node {i} has no examples")
                if p.min() < 0 or p.max() >= n:
                    raise DataError(f"node {i}'s indices fall outside 0..{n - 1}")
            object.__setattr__(self, "parts", parts)
        object.__setattr__(self, "fingerprint", _fingerprint(self.dataset, self.parts))

    @property
    def n_nodes(self) -> int | None:
        """Number of nodes the user's per-node data fixes, or None when it fixes none."""
        return None if self.parts is None else len(self.parts)

    def check_fingerprint(self, expected: str) -> None:
        """ConfigError unless this data's fingerprint is ``expected`` (the run being resumed)."""
        if self.fingerprint != expected:
            raise ConfigError(
                f"the data differs from the run's (fingerprint {self.fingerprint[:16]}, expected "
                f"{str(expected)[:16]}); pass the same data and eval_data as the original run"
            )

    def node_parts(self, n_nodes: int, partition: str = "iid", *, seed: int) -> list[np.ndarray]:
        """The user's per-node split if given (it must have ``n_nodes`` nodes), else
        :func:`partition_parts` of the training labels."""
        if self.parts is None:
            return partition_parts(self.dataset.y_train.numpy(), n_nodes, partition, seed=seed)
        if n_nodes != len(self.parts):
            raise ConfigError(
                f"the data has {len(self.parts)} per-node datasets but the run has {n_nodes} nodes"
            )
        return self.parts


def _hash_tensor(h: Any, name: str, t: torch.Tensor) -> None:
    h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
    h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def _fingerprint(ds: Dataset, parts: list[np.ndarray] | None) -> str:
    h = hashlib.sha256(f"privdl/user-data/v1 n_classes={ds.n_classes}\n".encode())
    _hash_tensor(h, "x_train", ds.x_train)
    _hash_tensor(h, "y_train", ds.y_train)
    if ds.x_test is ds.x_train and ds.y_test is ds.y_train:
        h.update(b"test = train\n")
    else:
        _hash_tensor(h, "x_test", ds.x_test)
        _hash_tensor(h, "y_test", ds.y_test)
    h.update(f"parts {'none' if parts is None else len(parts)}\n".encode())
    for p in parts or []:
        h.update(f"part {p.size}\n".encode())
        # numpy's stubs give ndarray __buffer__ only for Python >= 3.12 (3.11 has the protocol)
        h.update(np.ascontiguousarray(p, dtype=np.int64))  # type: ignore[arg-type]
    return h.hexdigest()


def _describe(obj: object) -> str:
    if isinstance(obj, (tuple, list)):
        inner = ", ".join(type(v).__name__ for v in obj[:3]) + (", ..." if len(obj) > 3 else "")
        return f"a {type(obj).__name__} of {len(obj)} ({inner})"
    return f"a {type(obj).__name__}"


def _is_pair(obj: object) -> TypeGuard[tuple[Any, ...] | list[Any]]:
    return (
        isinstance(obj, (tuple, list))
        and len(obj) == 2
        and all(isinstance(v, _ARRAYS) for v in obj)
    )


def _as_tensor(v: torch.Tensor | np.ndarray, what: str) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if v.dtype.kind not in "biuf":
        raise DataError(f"{what} has unsupported numpy dtype {v.dtype}; expected numbers")
    return torch.from_numpy(np.ascontiguousarray(v))


def _materialise(ds: TorchDataset, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Read a map-style torch Dataset once and stack its (x, y) items."""
    if isinstance(ds, IterableDataset):
        raise ConfigError(
            f"{what}: an IterableDataset cannot be used (no len() or indexing to partition and "
            "stack it); pass a map-style Dataset or (X, y) tensors"
        )
    if type(ds) is TensorDataset and len(ds.tensors) == 2:
        return ds.tensors[0].detach().cpu(), ds.tensors[1].detach().cpu()
    try:
        n = len(ds)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{what}: the torch Dataset has no len(); it must be map-style") from None
    if n == 0:
        return torch.zeros(0, 1), torch.zeros(0, dtype=torch.int64)
    xs, ys = [], []
    for i in range(n):
        item = ds[i]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise DataError(f"{what}: item {i} must be an (x, y) pair, got {_describe(item)}")
        try:
            xs.append(torch.as_tensor(item[0]).detach().cpu())
            ys.append(torch.as_tensor(item[1]).detach().cpu())
        except (TypeError, ValueError, RuntimeError):
            raise DataError(
                f"{what}: item {i} ({type(item[0]).__name__}, {type(item[1]).__name__}) is not "
                "convertible to tensors; give the Dataset a transform that returns tensors"
            ) from None
    for name, vals in (("x", xs), ("y", ys)):
        bad = next((i for i, v in enumerate(vals) if v.shape != vals[0].shape), None)
        if bad is not None:
            raise DataError(
                f"{what}: item {bad}'s {name} has shape {tuple(vals[bad].shape)}, item 0's has "
                f"{tuple(vals[0].shape)}; all items must have the same shapes"
            )
    return torch.stack(xs), torch.stack(ys)


def _one(obj: object, what: str, empty: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One (X, y) pair or torch Dataset -> checked (float X, int64 y) tensors."""
    if isinstance(obj, TorchDataset):
        x, y = _materialise(obj, what)
    elif _is_pair(obj):
        x, y = _as_tensor(obj[0], f"{what} X"), _as_tensor(obj[1], f"{what} y")
    else:
        raise ConfigError(f"{what} must be {_FORMS}, got {_describe(obj)}")
    if x.dim() == 0 or y.dim() == 0:
        raise DataError(f"{what}: X and y must have a leading example dimension N")
    if x.shape[0] != y.shape[0]:
        raise DataError(f"{what}: X has {x.shape[0]} examples but y has {y.shape[0]}")
    if x.shape[0] == 0:
        raise DataError(empty)
    if x.dim() < 2:
        raise DataError(f"{what}: X must have shape (N, *input_shape), got {tuple(x.shape)}")
    if x.is_complex():
        raise DataError(f"{what}: X must be real-valued, got dtype {x.dtype}")
    keep = x.dtype in (torch.float32, torch.float64)
    x = x.to(x.dtype if keep else torch.float32, copy=True)
    check_finite(x, what=f"{what} X")
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise DataError(f"{what}: y must hold integer class labels, got dtype {y.dtype}")
    if y.dim() != 1:
        raise DataError(f"{what}: y must have shape (N,), got {tuple(y.shape)}")
    y = y.to(torch.int64, copy=True)
    if int(y.min()) < 0:
        raise DataError(f"{what}: y has negative label {int(y.min())}; labels must be 0..C-1")
    return x, y


def user_data(
    data: object,
    *,
    eval_data: object | None = None,
    n_classes: int | None = None,
    name: str = "user",
) -> UserData:
    """Normalise user-supplied data (see the module docstring for the accepted forms).

    ``n_classes`` defaults to ``max label + 1`` over the train and eval labels. Raises
    :class:`DataError` for bad contents and :class:`ConfigError` for unsupported forms.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name must be a non-empty string, got {name!r}")
    parts: list[np.ndarray] | None = None
    if isinstance(data, TorchDataset) or _is_pair(data):
        x, y = _one(data, "train data", "train data is empty (0 examples)")
    elif isinstance(data, (tuple, list)):
        if not data:
            raise DataError("data is an empty list: no per-node datasets given")
        if any(isinstance(d, _ARRAYS) for d in data):
            raise ConfigError(f"data must be {_FORMS} or a list of them; got {_describe(data)}")
        nodes = [_one(d, f"node {i}", f"node {i} has no examples") for i, d in enumerate(data)]
        shape = nodes[0][0].shape[1:]
        for i, (xi, _) in enumerate(nodes):
            if xi.shape[1:] != shape:
                raise DataError(
                    f"node {i}: examples have shape {tuple(xi.shape[1:])}, node 0's have "
                    f"{tuple(shape)}"
                )
        dtype = torch.float64 if any(xi.dtype == torch.float64 for xi, _ in nodes) else None
        x = torch.cat([xi.to(dtype or xi.dtype) for xi, _ in nodes])
        y = torch.cat([yi for _, yi in nodes])
        ends = np.cumsum([0] + [yi.shape[0] for _, yi in nodes])
        parts = [np.arange(a, b, dtype=np.int64) for a, b in zip(ends[:-1], ends[1:], strict=True)]
    else:
        raise ConfigError(
            f"data must be {_FORMS}, or a list of them (one per node); got {_describe(data)}"
        )

    x_test, y_test = x, y
    if eval_data is not None:
        if not (isinstance(eval_data, TorchDataset) or _is_pair(eval_data)):
            raise ConfigError(
                f"eval_data must be {_FORMS} (not per-node), got {_describe(eval_data)}"
            )
        x_test, y_test = _one(eval_data, "eval data", "eval data is empty (0 examples)")
        if x_test.shape[1:] != x.shape[1:]:
            raise DataError(
                f"eval data examples have shape {tuple(x_test.shape[1:])}, train data's have "
                f"{tuple(x.shape[1:])}"
            )
    top = {"train": int(y.max()), "eval": int(y_test.max())}
    if n_classes is None:
        n_classes = max(top.values()) + 1
    elif (
        not isinstance(n_classes, (int, np.integer)) or isinstance(n_classes, bool) or n_classes < 1
    ):
        raise ConfigError(f"n_classes must be a positive integer, got {n_classes!r}")
    for split, m in top.items():
        if m >= n_classes:
            raise DataError(f"{split} data has label {m} >= n_classes={n_classes}")

    where = f" over {len(parts)} user-given nodes" if parts is not None else ""
    if eval_data is None:
        test_note = "no eval_data given: the test split IS the training data"
    else:
        test_note = f"test split: {y_test.shape[0]} user-supplied eval examples"
    ds = Dataset(
        x_train=x,
        y_train=y,
        x_test=x_test,
        y_test=y_test,
        name=name,
        n_classes=int(n_classes),
        source_note=f"user-supplied data: {y.shape[0]} training examples{where}; {test_note}",
    )
    return UserData(dataset=ds, parts=parts)


def partition_parts(
    labels: np.ndarray | torch.Tensor, n_nodes: int, spec: str, *, seed: int
) -> list[np.ndarray]:
    """Split training labels over ``n_nodes`` as ``SupervisedTask`` does: ``spec`` is "iid",
    "dirichlet:ALPHA" or "shards:K", drawn from ``np.random.default_rng(seed)``."""
    y = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    kind, sep, arg = str(spec).partition(":")
    rng = np.random.default_rng(seed)
    if kind == "iid" and not sep:
        return partition_iid(y, n_nodes, rng=rng)
    if kind in ("dirichlet", "shards"):
        try:
            value = float(arg)
        except ValueError:
            value = float("nan")
        if not np.isfinite(value) or value <= 0:
            raise ConfigError(f"partition {spec!r}: expected dirichlet:ALPHA or shards:K, > 0")
        if kind == "dirichlet":
            return partition_dirichlet(y, n_nodes, value, rng=rng)
        return partition_shards(y, n_nodes, int(value), rng=rng)
    raise ConfigError(f"unknown partition {spec!r}; expected iid, dirichlet:ALPHA or shards:K")
