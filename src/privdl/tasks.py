"""Tasks: a dataset split over nodes, a model and a loss; they give algorithms gradient oracles.

- :class:`LeastSquaresTask` — DECOR's synthetic least squares (spec decor.md §6.2), full local
  gradients, user-level privacy.
- :class:`SupervisedTask` — a dataset partitioned over nodes (iid, shards, Dirichlet) with a
  stacked model from :mod:`privdl.models`; minibatches are drawn for every node at once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch

from privdl.comm.base import Tree
from privdl.engine.clipping import clip_by_global_norm
from privdl.engine.grads import ClipSpec, GradResult, evaluate, node_gradients
from privdl.errors import ConfigError


def step_generator(
    seed: int, purpose: str, t: int, device: str | torch.device = "cpu"
) -> torch.Generator:
    """A generator that depends only on ``(seed, purpose, t)``: batches are resumable."""
    digest = hashlib.sha256(f"privdl/{purpose}/{int(seed)}/{int(t)}".encode()).digest()
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g


@dataclass
class LeastSquaresTask:
    """``L_i(x) = 1/2 ||A_i x - b_i||^2`` with ``A_i = (i/sqrt n) I`` (DECOR §6.2).

    Every node uses its full local gradient (no sampling); the clipping the algorithm asks for is
    applied to that gradient (user-level).
    """

    n_nodes: int
    dim: int = 10
    seed: int = 1
    zeta: float = 1.0
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    kind: str = field(default="least-squares", init=False)

    def __post_init__(self) -> None:
        from privdl.data import least_squares_problem

        self.problem = least_squares_problem(
            self.n_nodes, d=self.dim, zeta=self.zeta, rng=np.random.default_rng(self.seed)
        )
        self._a = torch.as_tensor(self.problem.a_scale, dtype=self.dtype, device=self.device)
        self._b = torch.as_tensor(self.problem.b, dtype=self.dtype, device=self.device)
        self._x_star = torch.as_tensor(self.problem.x_star, dtype=self.dtype, device=self.device)

    @property
    def loss_name(self) -> str:
        return "mse"

    def init_params(self, *, seed: int) -> Tree:
        """All nodes start at the all-ones vector, as in the reference code."""
        return {"x": torch.ones(self.n_nodes, self.dim, dtype=self.dtype, device=self.device)}

    def _losses(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self._a[:, None] * x - self._b).pow(2).sum(dim=-1)

    def oracle(self, params: Tree, t: int, *, clip: ClipSpec) -> GradResult:
        x = params["x"]
        a = self._a[:, None]
        grads = {"x": a * (a * x - self._b)}
        if clip.mode != "none":
            grads = clip_by_global_norm(grads, clip.threshold, kind=clip.kind)
        return GradResult(grads=grads, loss=self._losses(x), per_sample_norms=None)

    def sample_oracle(self, *, clip: float | None, block_size: int = 1):
        """Per-sample oracle for PrivSGP(-VR): row j of ``A_i = a_i I`` is sample j of node i.

        ``f_i(x; j) = 1/2 (a_i x_j - b_ij)^2``, so ``(1/d) sum_j f_i(x; j) = L_i(x) / d``: the same
        minimiser, with ``J = d`` samples per node (PrivSGP-VR Algorithm 1's ``f_i``).
        """
        from privdl.algorithms.privsgp import LeastSquaresSamples

        if block_size != 1:
            raise ConfigError("least-squares has one sample per coordinate: use block_size 1")
        eye = torch.eye(self.dim, dtype=self.dtype, device=self.device)
        return LeastSquaresSamples(self._a[:, None, None] * eye, self._b.clone(), clip=clip)

    def evaluate(self, params: Tree) -> dict[str, float]:
        x = params["x"]
        xbar = x.mean(dim=0)
        l_star = float(self._losses(self._x_star.expand_as(x)).mean())
        return {
            "loss": float(self._losses(xbar.expand_as(x)).mean()),
            "loss_gap": float(self._losses(xbar.expand_as(x)).mean()) - l_star,
            "optimality_gap": float((x - self._x_star).pow(2).sum(dim=1).mean()),
        }


def default_model(task: str) -> str:
    return {"a9a": "linear", "mnist": "mlp", "fashion-mnist": "cnn-fmnist"}.get(task, "resnet18-gn")


@dataclass
class SupervisedTask:
    """A dataset split over ``n_nodes`` with a stacked model; vectorized over nodes."""

    dataset_name: str
    n_nodes: int
    model_name: str | None = None
    partition: str = "iid"
    batch_size: int = 64
    sampling: str = "without_replacement"
    data_seed: int = 1
    seed: int = 0
    data_dir: str | None = None
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    eval_max: int = 20000
    kind: str = field(default="supervised", init=False)

    def __post_init__(self) -> None:
        from privdl.data import (
            load_dataset,
            partition_dirichlet,
            partition_iid,
            partition_shards,
            stack_partitions,
        )
        from privdl.models import build_model

        ds = load_dataset(self.dataset_name, data_dir=self.data_dir, seed=self.data_seed)
        self.dataset = ds
        labels = ds.y_train.numpy()
        rng = np.random.default_rng(self.data_seed)
        kind, _, arg = self.partition.partition(":")
        if kind == "iid":
            parts = partition_iid(labels, self.n_nodes, rng=rng)
        elif kind == "dirichlet":
            parts = partition_dirichlet(labels, self.n_nodes, float(arg), rng=rng)
        elif kind == "shards":
            parts = partition_shards(labels, self.n_nodes, int(float(arg)), rng=rng)
        else:  # validated by the config already
            raise ConfigError(f"unknown partition {self.partition!r}")
        x = ds.x_train.to(self.dtype)
        self.data = stack_partitions(x.to(self.device), ds.y_train.to(self.device), parts)
        counts = self.data.counts
        if self.sampling == "without_replacement" and self.batch_size > int(counts.min()):
            raise ConfigError(
                f"batch size {self.batch_size} exceeds the smallest node's data ({int(counts.min())})"
            )
        self.binary = (
            ds.n_classes == 2 and (self.model_name or default_model(self.dataset_name)) == "linear"
        )
        self.model = build_model(
            self.model_name or default_model(self.dataset_name),
            in_shape=tuple(ds.input_shape),
            n_classes=1 if self.binary else ds.n_classes,
        )
        self.loss_name = "bce" if self.binary else "cross_entropy"
        # evaluation sets (the averaged model on the full train split and on the test split)
        self._x_train_eval = x[: self.eval_max].to(self.device)
        self._y_train_eval = ds.y_train[: self.eval_max].to(self.device)
        self._x_test = ds.x_test.to(self.dtype).to(self.device)
        self._y_test = ds.y_test.to(self.device)

    @property
    def sampling_rate(self) -> float:
        """Per-node sampling rate ``b / m_i`` of the smallest node (worst case for accounting)."""
        return float(self.batch_size / int(self.data.counts.min()))

    def init_params(self, *, seed: int) -> Tree:
        g = torch.Generator().manual_seed(int(seed))
        params = self.model.init(n_nodes=self.n_nodes, generator=g, dtype=self.dtype, device="cpu")
        return {k: v.to(self.device) for k, v in params.items()}

    def oracle(self, params: Tree, t: int, *, clip: ClipSpec) -> GradResult:
        from privdl.data import gather_batch, sample_batches

        data = self.data
        if self.sampling == "full":
            xb, yb, mask = data.x, data.y, data.valid
            denom = None
        else:
            g = step_generator(self.seed, "batches", t)
            bi = sample_batches(
                data.counts,
                self.batch_size,
                generator=g,
                scheme=self.sampling,
                m_max=data.x.shape[1],
            )
            xb, yb = gather_batch(data.x, bi.index), gather_batch(data.y, bi.index)
            mask = bi.mask if self.sampling == "poisson" else None
            denom = float(self.batch_size) if self.sampling == "poisson" else None
        return node_gradients(
            self.model,
            params,
            xb,
            yb,
            loss=self.loss_name,
            clip=clip,
            mask=mask,
            denominator=denom,
        )

    def sample_oracle(self, *, clip: float | None, block_size: int = 1):
        """Block oracle for PrivSGP(-VR) (spec privsgp-vr.md §8.1): node i's first ``m`` samples
        (``m`` = the smallest node's count), in blocks of ``block_size``; table in the run's dtype.
        """
        from privdl.algorithms.privsgp import ModelSamples

        m = int(self.data.counts.min())
        return ModelSamples(
            self.model,
            self.data.x[:, :m],
            self.data.y[:, :m],
            block_size=block_size,
            loss=self.loss_name,
            clip=clip,
            table_dtype=self.dtype,
        )

    def evaluate(self, params: Tree) -> dict[str, float]:
        avg = {k: v.mean(dim=0, keepdim=True) for k, v in params.items()}
        tr_loss, tr_acc = evaluate(
            self.model, avg, self._x_train_eval, self._y_train_eval, loss=self.loss_name
        )
        te_loss, te_acc = evaluate(self.model, avg, self._x_test, self._y_test, loss=self.loss_name)
        return {
            "loss": float(tr_loss[0]),
            "train_accuracy": float(tr_acc[0]),
            "test_loss": float(te_loss[0]),
            "accuracy": float(te_acc[0]),
        }


def build_task(cfg) -> LeastSquaresTask | SupervisedTask:
    """The task a :class:`~privdl.config.RunConfig` asks for, on its graph's nodes (or, for a
    federated run, its ``clients``)."""
    from privdl.config import FEDERATED
    from privdl.topology import parse_topology

    n = cfg.clients if cfg.algorithm in FEDERATED else parse_topology(cfg.graph).n
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    if cfg.task == "least-squares":
        return LeastSquaresTask(
            n, dim=cfg.ls_dim, seed=cfg.data_seed, dtype=dtype, device=cfg.device
        )
    return SupervisedTask(
        cfg.task,
        n,
        model_name=cfg.model,
        partition=cfg.partition,
        batch_size=cfg.batch_size,
        sampling=cfg.sampling,
        data_seed=cfg.data_seed,
        seed=cfg.seed,
        data_dir=cfg.data_dir,
        dtype=dtype,
        device=cfg.device,
    )
