"""Tasks: a dataset split over nodes, a model and a loss; they give algorithms gradient oracles.

- :class:`LeastSquaresTask` — DECOR's synthetic least squares (DECOR Section 6.1), full local
  gradients, user-level privacy.
- :class:`SupervisedTask` — a dataset partitioned over nodes (iid, shards, Dirichlet) with a
  stacked model from :mod:`privdl.models`; minibatches are drawn for every node at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from privdl.algorithms.privsgp import LeastSquaresSamples, ModelSamples
from privdl.data import (
    gather_batch,
    least_squares_problem,
    load_dataset,
    sample_batches,
    stack_partitions,
)
from privdl.data.custom import UserData, partition_parts
from privdl.engine.clipping import clip_by_global_norm
from privdl.engine.cuda_graph import GraphedGradients
from privdl.engine.grads import ClipSpec, GradResult, check_indices, evaluate, node_gradients
from privdl.errors import ConfigError
from privdl.models import build_model
from privdl.models.base import StackedModel
from privdl.models.module import from_module
from privdl.rng import step_generator
from privdl.topology import parse_topology
from privdl.tree import Tree

__all__ = ["LeastSquaresTask", "SupervisedTask", "build_task", "step_generator"]


def _all_nodes(nodes: Sequence[int] | None, n: int) -> bool:
    return nodes is None or list(nodes) == list(range(n))


@dataclass
class LeastSquaresTask:
    """``L_i(x) = 1/2 ||A_i x - b_i||^2`` with ``A_i = (i/sqrt n) I`` (DECOR §6.1).

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
            grads = clip_by_global_norm(grads, cast(float, clip.threshold), kind=clip.kind)
        return GradResult(grads=grads, loss=self._losses(x), per_sample_norms=None)

    def oracle_for(self, nodes: Sequence[int] | None = None):
        """The gradient oracle of the nodes ``nodes`` (a process's shard; all if None)."""
        if _all_nodes(nodes, self.n_nodes):
            return self.oracle
        idx = torch.as_tensor(list(nodes), dtype=torch.long, device=self._a.device)  # type: ignore[arg-type]
        a, b = self._a[idx][:, None], self._b[idx]

        def shard_oracle(params: Tree, t: int, *, clip: ClipSpec) -> GradResult:
            x = params["x"]
            grads = {"x": a * (a * x - b)}
            if clip.mode != "none":
                grads = clip_by_global_norm(grads, cast(float, clip.threshold), kind=clip.kind)
            loss = 0.5 * (a * x - b).pow(2).sum(dim=-1)
            return GradResult(grads=grads, loss=loss, per_sample_norms=None)

        return shard_oracle

    def sample_oracle(
        self, *, clip: float | None, block_size: int = 1, nodes: Sequence[int] | None = None
    ) -> LeastSquaresSamples:
        """Per-sample oracle for PrivSGP(-VR): row j of ``A_i = a_i I`` is sample j of node i.

        ``f_i(x; j) = 1/2 (a_i x_j - b_ij)^2``, so ``(1/d) sum_j f_i(x; j) = L_i(x) / d``: the same
        minimiser, with ``J = d`` samples per node (PrivSGP-VR Algorithm 1's ``f_i``).
        ``nodes``: the rows of a process's shard (all if None).
        """
        if block_size != 1:
            raise ConfigError("least-squares has one sample per coordinate: use block_size 1")
        eye = torch.eye(self.dim, dtype=self.dtype, device=self.device)
        full = LeastSquaresSamples(self._a[:, None, None] * eye, self._b.clone(), clip=clip)
        return full if _all_nodes(nodes, self.n_nodes) else full.rows(list(nodes))  # type: ignore[arg-type]

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
    return {"a9a": "linear", "mnist": "mlp", "fashion-mnist": "cnn-fmnist", "user": "mlp"}.get(
        task, "resnet18-gn"
    )


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
    #: a Python caller's own model and data (:class:`UserObjects`), in place of the names
    user: UserObjects | None = None
    #: on CUDA, replay the clipped gradients from CUDA graphs (the same values;
    #: :class:`privdl.engine.cuda_graph.GraphedGradients`); no effect elsewhere
    cuda_graphs: bool = True
    kind: str = field(default="supervised", init=False)
    #: one GraphedGradients per (clipping, denominator), made on first use on CUDA
    _graphs: dict[tuple, GraphedGradients] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        user = self.user
        if user is not None and user.data is not None:
            ds = user.data.dataset
            parts = user.data.node_parts(self.n_nodes, self.partition, seed=self.data_seed)
        else:
            ds = load_dataset(self.dataset_name, data_dir=self.data_dir, seed=self.data_seed)
            parts = partition_parts(ds.y_train.numpy(), self.n_nodes, self.partition,
                                    seed=self.data_seed)  # fmt: skip
        self.dataset = ds
        if user is not None and user.model is not None:
            self.model = user_model(user.model, in_shape=tuple(ds.input_shape))
            out = tuple(getattr(self.model, "out_shape", (ds.n_classes,)))
            self.binary = ds.n_classes == 2 and out == (1,)
            if not self.binary and out != (ds.n_classes,):
                raise ConfigError(
                    f"the model outputs shape {out} per example; the data has {ds.n_classes} "
                    f"classes: give one logit per class (or one for two classes)"
                )
        else:
            self.binary = (
                ds.n_classes == 2
                and (self.model_name or default_model(self.dataset_name)) == "linear"
            )
            self.model = build_model(
                self.model_name or default_model(self.dataset_name),
                in_shape=tuple(ds.input_shape),
                n_classes=1 if self.binary else ds.n_classes,
            )
        self.loss_name = "bce" if self.binary else "cross_entropy"
        x, x_test = self._model_input(ds.x_train), self._model_input(ds.x_test)
        self.data = stack_partitions(x.to(self.device), ds.y_train.to(self.device), parts)
        counts = self.data.counts
        if self.sampling == "without_replacement" and self.batch_size > int(counts.min()):
            raise ConfigError(
                f"batch size {self.batch_size} exceeds the smallest node's data ({int(counts.min())})"
            )
        # evaluation sets (the averaged model on the full train split and on the test split)
        self._x_train_eval = x[: self.eval_max].to(self.device)
        self._y_train_eval = ds.y_train[: self.eval_max].to(self.device)
        self._x_test = x_test.to(self.device)
        self._y_test = ds.y_test.to(self.device)

    def _model_input(self, x: torch.Tensor) -> torch.Tensor:
        """Features in the run's dtype, or int64 indices for a model that reads its input with
        an embedding (``DataError`` unless they are integers of its vocabulary)."""
        if not self.model.takes_indices:
            return x.to(self.dtype)
        check_indices(x, self.model.input_vocabulary, what=f"the data for {self.model.name}")
        return x.long()

    @property
    def sampling_rate(self) -> float:
        """Per-node sampling rate ``b / m_i`` of the smallest node (worst case for accounting)."""
        return float(self.batch_size / int(self.data.counts.min()))

    def init_params(self, *, seed: int) -> Tree:
        g = torch.Generator().manual_seed(int(seed))
        params = self.model.init(n_nodes=self.n_nodes, generator=g, dtype=self.dtype, device="cpu")
        return {k: v.to(self.device) for k, v in params.items()}

    def oracle(self, params: Tree, t: int, *, clip: ClipSpec) -> GradResult:
        """Clipped gradients of every node on its minibatch of step ``t``."""
        data = self.data
        mask: torch.Tensor | None
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
        return self._gradients(params, xb, yb, clip=clip, mask=mask, denominator=denom)

    def _gradients(
        self,
        params: Tree,
        xb: torch.Tensor,
        yb: torch.Tensor,
        *,
        clip: ClipSpec,
        mask: torch.Tensor | None,
        denominator: float | None,
    ) -> GradResult:
        """:func:`node_gradients` of the batch; on CUDA replayed from a graph per clipping."""
        if not (self.cuda_graphs and xb.device.type == "cuda"):
            return node_gradients(
                self.model, params, xb, yb, loss=self.loss_name, clip=clip, mask=mask,
                denominator=denominator,
            )  # fmt: skip
        g = self._graphs.get((clip, denominator))
        if g is None:
            g = self._graphs[(clip, denominator)] = GraphedGradients(
                self.model, loss=self.loss_name, clip=clip, denominator=denominator
            )
        return g(params, xb, yb, mask=mask)

    def oracle_for(self, nodes: Sequence[int] | None = None):
        """The gradient oracle of the nodes ``nodes`` (a process's shard; all if None).

        The minibatch indices come from the generator keyed by ``(seed, t)`` for all ``n`` nodes
        (the same draw in every process, as in the simulator); the shard keeps its rows and
        computes only its own nodes' gradients (DECOR Alg. 1 line 2).
        """
        if _all_nodes(nodes, self.n_nodes):
            return self.oracle
        data = self.data
        idx = torch.as_tensor(list(nodes), dtype=torch.long, device=data.x.device)  # type: ignore[arg-type]
        x_all, y_all = data.x[idx], data.y[idx]

        def shard_oracle(params: Tree, t: int, *, clip: ClipSpec) -> GradResult:
            mask: torch.Tensor | None
            if self.sampling == "full":
                xb, yb, mask, denom = x_all, y_all, data.valid[idx], None
            else:
                bi = sample_batches(
                    data.counts,
                    self.batch_size,
                    generator=step_generator(self.seed, "batches", t),
                    scheme=self.sampling,
                    m_max=data.x.shape[1],
                )
                index = bi.index[idx]
                rows = torch.arange(index.shape[0], device=index.device)[:, None]
                xb, yb = x_all[rows, index], y_all[rows, index]
                mask = bi.mask[idx] if self.sampling == "poisson" else None
                denom = float(self.batch_size) if self.sampling == "poisson" else None
            return self._gradients(params, xb, yb, clip=clip, mask=mask, denominator=denom)

        return shard_oracle

    def sample_oracle(
        self, *, clip: float | None, block_size: int = 1, nodes: Sequence[int] | None = None
    ) -> ModelSamples:
        """Block oracle for PrivSGP(-VR) (PrivSGP-VR Algorithm 1 with a table of block means):
        node i's first ``m`` samples (``m`` = the smallest node's count), in blocks of
        ``block_size``; table in the run's dtype. ``nodes``: a process's shard (all if None).
        """
        m = int(self.data.counts.min())
        full = ModelSamples(
            self.model,
            self.data.x[:, :m],
            self.data.y[:, :m],
            block_size=block_size,
            loss=self.loss_name,
            clip=clip,
            table_dtype=self.dtype,
        )
        return full if _all_nodes(nodes, self.n_nodes) else full.rows(list(nodes))  # type: ignore[arg-type]

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


@dataclass(frozen=True)
class UserObjects:
    """What a Python caller hands over instead of names: its data (tensors, Datasets or
    per-node datasets, normalised by :func:`privdl.data.custom.user_data`) and its model (an
    ``nn.Module``, a factory that makes one, or a :class:`~privdl.models.StackedModel`)."""

    data: UserData | None = None
    model: Any = None


def user_model(model: Any, *, in_shape: tuple[int, ...]) -> StackedModel:
    """A stacked model of a caller's ``nn.Module`` (every node starts from its weights), of a
    factory (each draw seeded by the run), or the :class:`StackedModel` itself."""
    if isinstance(model, StackedModel):
        return model
    if isinstance(model, nn.Module) or callable(model):
        return from_module(model, in_shape=in_shape)
    raise ConfigError(
        f"model must be an nn.Module, a function or class that makes one, or a model name; got "
        f"{type(model).__name__}"
    )


def build_task(
    cfg: Any, *, n_nodes: int | None = None, user: UserObjects | None = None
) -> LeastSquaresTask | SupervisedTask:
    """The task a run configuration asks for, on ``n_nodes`` nodes (default: its graph's, or a
    federated run's ``clients``); ``user``: a Python caller's own model and data."""
    if n_nodes is None:
        clients = getattr(cfg, "clients", None)
        n_nodes = int(clients) if clients else parse_topology(cfg.graph).n
    n = n_nodes
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    if cfg.task == "least-squares":
        return LeastSquaresTask(
            n, dim=cfg.ls_dim, seed=cfg.data_seed, dtype=dtype, device=cfg.device
        )
    if cfg.task == "user" and (user is None or user.data is None):
        raise ConfigError(
            "task 'user' trains on data you pass from Python: privdl.train(..., data=(X, y))"
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
        user=user,
    )
