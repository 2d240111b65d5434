"""PrivSGP-VR and PrivSGP: DP stochastic gradient push (Zhu et al.; docs/privsgp-vr.md).

One iteration k for all nodes at once (Algorithm 1; stacked form eq. 15):

    z_i       = x_i / w_i                                        (line 9 of the previous step)
    xi_i      ~ U{0..J-1}, fresh per node and per k              (line 1)
    h_i       = grad f_i(z_i; xi_i)                               (line 2, at the DE-BIASED point)
    g_i       = h_i - T_i[xi_i] + mbar_i                          (line 3, eq. 6; OLD entry, OLD mean)
    mbar_i   += (h_i - T_i[xi_i]) / J;  T_i[xi_i] = h_i           (line 4, eq. 5; clean gradient)
    x_i^+1/2  = x_i - gamma (g_i + N_i),  N_i ~ N(0, sigma_i^2 I) (lines 5-6, eq. 7)
    x^+, w^+  = P^k x^+1/2, P^k w                                 (lines 7-8; column-stochastic P^k)

PrivSGP (Appendix C, Algorithm 2) is the same without the SAGA table: ``g_i = h_i``.

The table is a "block" table (docs/privsgp-vr.md, "Python API"; the paper is silent on
the memory of the SAGA table): each node's J local samples are split into
``J_b = floor(J / block_size)`` fixed blocks; an entry is a block's mean (per-sample clipped)
gradient, and ``J_b`` replaces ``J`` everywhere. ``block_size = 1`` is the exact per-sample table.
For least squares (:class:`LeastSquaresSamples`) an entry is one scalar per sample (the residual),
so the exact table costs ``n J`` floats instead of ``n J d``.

Privacy: :func:`noise_plan` gives sigma_i per node from Theorem 2 (``mode="nominal"``, eq. 11,
with the unspecified constant c2), from the accountant ``privdl run`` certifies with
(``mode="accounted"``) or from the paper-style Poisson approximation
(``mode="poisson_approximation"``, not certified); :func:`optimal_steps` gives K* in each mode
(eq. 12, or a numerical minimum of U(K), eq. 14).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, cast

import numpy as np
import torch
from torch import Tensor

from privdl.algorithms.base import Keys, StepInfo, StepSize, held_nodes, in_background
from privdl.comm.base import Communicator
from privdl.engine.grads import ClipSpec, node_gradients
from privdl.errors import ConfigError, PrivacyError
from privdl.mechanisms.correlated import independent_noise
from privdl.mechanisms.prng import NormalBackend
from privdl.rng import step_generator
from privdl.tree import Tree, flatten
from privdl.tree import unflatten as unflatten_like

log = logging.getLogger("privdl.privsgp")

#: Default memory budget of the SAGA table over all nodes (bytes).
DEFAULT_TABLE_BUDGET = 2 * 1024**3


# --------------------------------------------------------------------------- sample oracles
class SampleOracle(Protocol):
    """Gradients of chosen table entries ("samples" or blocks), vectorised over nodes.

    ``entries(params, index)`` returns ``(entry, loss)``: the compact table entry ``(n, E)`` of
    ``grad f_i(params_i; index_i)`` and the per-node loss. ``expand(entry, index)`` turns compact
    entries back into flat gradients ``(n, P)``; ``all_entries(params)`` is the initial full pass
    ``(n, J, E)``; ``table_mean(table)`` is ``(1/J) sum_j expand(T[:, j], j)``.
    """

    n_nodes: int
    n_entries: int
    entry_size: int
    dim: int

    def entries(self, params: Tree, index: Tensor) -> tuple[Tensor, Tensor]: ...
    def expand(self, entry: Tensor, index: Tensor) -> Tensor: ...
    def all_entries(self, params: Tree) -> Tensor: ...
    def table_mean(self, table: Tensor) -> Tensor: ...


@dataclass
class LeastSquaresSamples:
    """Per-sample least squares ``f_i(x; j) = 1/2 (a_ij^T x - b_ij)^2`` (a toy that checks the SAGA
    recursion: n = 1, sigma = 0 is plain SAGA).

    ``a (n, J, d)``, ``b (n, J)``; params ``{"x": (n, d)}``. The table entry is the scalar
    residual ``r = a^T x - b`` (times the clip factor), so ``grad = r a`` and the exact table is
    ``n J`` floats. ``clip``: per-sample clipping threshold (None: no clipping).
    """

    a: Tensor
    b: Tensor
    clip: float | None = None
    n_nodes: int = field(init=False)
    n_entries: int = field(init=False)
    entry_size: int = field(init=False, default=1)
    dim: int = field(init=False)

    def __post_init__(self) -> None:
        self.n_nodes, self.n_entries, self.dim = self.a.shape

    def _scalar(self, r: Tensor, a_norm: Tensor) -> Tensor:
        if self.clip is None:
            return r
        norm = r.abs() * a_norm
        return r * torch.clamp(self.clip / norm.clamp_min(1e-300), max=1.0)

    def entries(self, params: Tree, index: Tensor) -> tuple[Tensor, Tensor]:
        rows = torch.arange(self.n_nodes, device=index.device)
        a, b = self.a[rows, index], self.b[rows, index]
        r = (a * params["x"]).sum(-1) - b
        return self._scalar(r, a.norm(dim=-1))[:, None], 0.5 * r.pow(2)

    def expand(self, entry: Tensor, index: Tensor) -> Tensor:
        rows = torch.arange(self.n_nodes, device=index.device)
        return entry[:, :1] * self.a[rows, index]

    def all_entries(self, params: Tree) -> Tensor:
        r = torch.einsum("njd,nd->nj", self.a, params["x"]) - self.b
        return self._scalar(r, self.a.norm(dim=-1))[..., None]

    def table_mean(self, table: Tensor) -> Tensor:
        return torch.einsum("nj,njd->nd", table[..., 0], self.a) / self.n_entries

    def rows(self, nodes: Sequence[int]) -> LeastSquaresSamples:
        """The oracle of nodes ``nodes`` only (a process's shard, in that order)."""
        idx = torch.as_tensor(list(nodes), dtype=torch.long, device=self.a.device)
        return LeastSquaresSamples(self.a[idx], self.b[idx], clip=self.clip)

    def full_gradient(self, params: Tree) -> Tensor:
        """``grad f_i(x_i)`` of every node (for tests and evaluation)."""
        return self.table_mean(self.all_entries(params))


@dataclass
class ModelSamples:
    """Block gradients of a stacked model on node-stacked data (block table,
    docs/privsgp-vr.md).

    ``x (n, m, *in_shape)``, ``y (n, m)``: node i's samples. Block ``j`` of node i is samples
    ``j*B .. (j+1)*B - 1`` (the last ``m mod B`` samples are dropped); its entry is the mean of
    the per-sample gradients, each clipped at ``clip`` (None: no clipping). ``B = 1`` is exact.
    Gradients come from :func:`privdl.engine.node_gradients` (ghost clipping where the model
    allows it); the initial pass treats every (node, block) pair as a virtual node.
    """

    model: Any
    x: Tensor
    y: Tensor
    block_size: int = 1
    loss: str = "cross_entropy"
    clip: float | None = None
    table_dtype: torch.dtype = torch.float32
    chunk: int = 4096
    n_nodes: int = field(init=False)
    n_entries: int = field(init=False)
    entry_size: int = field(init=False)
    dim: int = field(init=False)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError(f"block size must be >= 1, got {self.block_size}")
        self.n_nodes, m = self.x.shape[:2]
        self.n_entries = m // self.block_size
        if self.n_entries < 1:
            raise ConfigError(f"block size {self.block_size} exceeds the {m} local samples")
        self.dim = self.entry_size = int(self.model.num_parameters())
        self._clip = ClipSpec() if self.clip is None else ClipSpec("per_sample", self.clip)

    def _grads(self, params: Tree, xb: Tensor, yb: Tensor) -> tuple[Tensor, Tensor]:
        res = node_gradients(self.model, params, xb, yb, loss=self.loss, clip=self._clip)
        return flatten(res.grads), res.loss

    def entries(self, params: Tree, index: Tensor) -> tuple[Tensor, Tensor]:
        bs = self.block_size
        pos = index[:, None] * bs + torch.arange(bs, device=index.device)[None, :]
        rows = torch.arange(self.n_nodes, device=index.device)[:, None]
        flat, loss = self._grads(params, self.x[rows, pos], self.y[rows, pos])
        return flat.to(self.table_dtype), loss

    def expand(self, entry: Tensor, index: Tensor) -> Tensor:
        return entry

    def all_entries(self, params: Tree) -> Tensor:
        n, bs, jb = self.n_nodes, self.block_size, self.n_entries
        table = torch.empty(n, jb, self.entry_size, dtype=self.table_dtype, device=self.x.device)
        per = max(1, self.chunk // (bs * n))
        for s in range(0, jb, per):  # chunks of blocks, all nodes at once (initial pass only)
            e = min(jb, s + per)
            xb = self.x[:, s * bs : e * bs].reshape(n * (e - s), bs, *self.x.shape[2:])
            yb = self.y[:, s * bs : e * bs].reshape(n * (e - s), bs)
            rep = {k: v.repeat_interleave(e - s, dim=0) for k, v in params.items()}
            flat, _ = self._grads(rep, xb, yb)
            table[:, s:e] = flat.reshape(n, e - s, -1).to(self.table_dtype)
        return table

    def table_mean(self, table: Tensor) -> Tensor:
        return table.mean(1)

    def rows(self, nodes: Sequence[int]) -> ModelSamples:
        """The oracle of nodes ``nodes`` only (a process's shard, in that order)."""
        idx = torch.as_tensor(list(nodes), dtype=torch.long, device=self.x.device)
        return replace(self, x=self.x[idx], y=self.y[idx])


def table_bytes(oracle: SampleOracle, *, dtype_bytes: int = 4) -> int:
    """Memory of the SAGA table over all nodes: ``n * J * entry_size`` floats
    (docs/privsgp-vr.md)."""
    return int(oracle.n_nodes) * int(oracle.n_entries) * int(oracle.entry_size) * dtype_bytes


# --------------------------------------------------------------------------- algorithm
@dataclass
class PrivSGPState:
    """Push-sum numerators ``x``, weights ``w``, the SAGA table and its running mean.

    ``nodes``: global ids of the rows held (a process's shard); ``None`` means all nodes.
    ``noise_keys`` are aligned with the rows.

    The table (n x J_b x d floats: 763 MB for MNIST at n = 50) is updated IN PLACE by
    :meth:`PrivSGP.step`, so the returned state shares it with the one passed in: copying it
    cost 93% of a step there (0.72 of 0.77 s). Stepping a state whose table a later step has
    already advanced raises :class:`ConfigError`; clone ``table`` to branch from a state.
    """

    x: Tree
    w: Tensor
    t: int = 0
    table: Tensor | None = None
    table_mean: Tensor | None = None
    seed: int = 0
    noise_keys: tuple[bytes, ...] = field(default=(), repr=False)
    nodes: tuple[int, ...] | None = None

    @property
    def params(self) -> Tree:
        """The de-biased models ``z_i = x_i / w_i``."""
        return {k: v / self.w.reshape(-1, *([1] * (v.dim() - 1))) for k, v in self.x.items()}


def _sample_index(seed: int, t: int, n: int, j: int, device: torch.device) -> Tensor:
    """``xi_i^k`` ~ U{0..J-1} i.i.d. per node; a function of ``(seed, t)`` only (resumable).

    Drawn by a CPU generator for all ``n`` nodes and then moved to ``device`` (``n`` integers per
    step): the draw is the same on every device and in every process, so CPU, CUDA and sharded
    runs follow the same sample path.
    """
    g = step_generator(seed, "privsgp-sample", t)
    return torch.randint(0, j, (n,), generator=g).to(device)


@dataclass(frozen=True)
class PrivSGP:
    """PrivSGP-VR (``variance_reduction=True``) or PrivSGP, with per-node noise stds ``sigmas``.

    ``sigmas``: one float for all nodes or one per node (Theorem 2 allows heterogeneous budgets).
    ``table_budget``: bytes the SAGA table may take; :meth:`init` refuses a bigger one.
    ``refresh_every``: recompute the running mean exactly every so many steps (default J).
    """

    step_size: StepSize
    sigmas: float | Sequence[float] = 0.0
    variance_reduction: bool = True
    table_budget: int = DEFAULT_TABLE_BUDGET
    refresh_every: int | None = None
    noise_backend: NormalBackend = "auto"  # keyed Gaussian streams: prng.resolve_backend

    def __post_init__(self) -> None:
        sig = [self.sigmas] if isinstance(self.sigmas, int | float) else list(self.sigmas)
        if any(not (math.isfinite(s) and s >= 0) for s in sig):
            raise PrivacyError(f"noise stds must be finite and >= 0, got {self.sigmas}")

    def _sigma(self, n: int, like: Tensor, nodes: Sequence[int] | None = None) -> Tensor:
        """``(rows, 1)`` stds of the held rows; ``n`` is the total number of nodes."""
        rows = n if nodes is None else len(nodes)
        if isinstance(self.sigmas, int | float):
            return torch.full((rows, 1), float(self.sigmas), dtype=like.dtype, device=like.device)
        if len(self.sigmas) != n:
            raise PrivacyError(f"got {len(self.sigmas)} noise stds for {n} nodes")
        sig = list(self.sigmas) if nodes is None else [self.sigmas[i] for i in nodes]
        return torch.as_tensor(sig, dtype=like.dtype, device=like.device)[:, None]

    def table_bytes(self, oracle: SampleOracle) -> int:
        return table_bytes(oracle) if self.variance_reduction else 0

    def init(
        self, params: Tree, oracle: SampleOracle, comm: Communicator, *, keys: Keys
    ) -> PrivSGPState:
        """``x = z = x^0``, ``w = 1`` and (VR) the initial full pass ``T_i[j] = grad f_i(x^0; j)``.

        ``params`` and ``oracle`` hold the rows of the nodes ``comm`` owns (a process's shard:
        ``oracle.rows(comm.owned_list)``); noise keys and the table are made for these nodes only,
        so a sharded run draws exactly the simulator's noise and samples for its rows. The entries
        ``xi`` are drawn from ``keys.sampling_seed``. Logs the table memory first and raises
        :class:`ConfigError` above ``table_budget``.
        """
        first = next(iter(params.values()))
        n = first.shape[0]
        nodes = held_nodes(comm, params)
        held = None if len(nodes) == comm.n_nodes else nodes
        if n != oracle.n_nodes:
            raise ConfigError(
                f"params have {n} nodes but the oracle has {oracle.n_nodes}"
                + ("; pass oracle.rows(comm.owned_list)" if held is not None else "")
            )
        w = torch.ones(n, dtype=first.dtype, device=first.device)
        noise_keys = keys.node_noise_keys(nodes)
        table = mean = None
        if self.variance_reduction:
            need = table_bytes(oracle)
            log.info("PrivSGP-VR SAGA table: %s", describe_table(oracle))
            if need > self.table_budget:
                raise ConfigError(
                    f"the SAGA table needs {need / 2**30:.2f} GiB ({describe_table(oracle)}) "
                    f"but the budget is {self.table_budget / 2**30:.2f} GiB; use a larger "
                    "block size or raise the memory budget"
                )
            table = oracle.all_entries(params)
            mean = oracle.table_mean(table)
        return PrivSGPState(
            x=dict(params),
            w=w,
            t=0,
            table=table,
            table_mean=mean,
            seed=keys.sampling_seed,
            noise_keys=noise_keys,
            nodes=held,
        )

    def step(
        self, state: PrivSGPState, oracle: SampleOracle, comm: Communicator
    ) -> tuple[PrivSGPState, StepInfo]:
        """One iteration of Algorithm 1 (or Algorithm 2 without the table) for every held node.

        With ``state.nodes`` (a shard) the indices ``xi^k`` are drawn for all ``comm.n_nodes``
        nodes, as in the simulator, and the held rows kept.
        """
        t = state.t
        gamma = self.step_size(t)
        z = state.params
        x_flat = flatten(state.x)
        n, j = x_flat.shape[0], oracle.n_entries
        if state.nodes is None:
            n_total = n
            xi = _sample_index(state.seed, t, n, j, x_flat.device)
        else:
            n_total = int(comm.n_nodes)
            held = torch.as_tensor(state.nodes, dtype=torch.long)
            xi = _sample_index(state.seed, t, n_total, j, torch.device("cpu"))[held]
            xi = xi.to(x_flat.device)
        sigma = self._sigma(n_total, x_flat, state.nodes)
        pending = None
        if bool((sigma > 0).any()):  # line 5's noise needs only the keys and t: draw it meanwhile
            pending = in_background(
                lambda: independent_noise(
                    state.noise_keys,
                    t,
                    x_flat.shape[1],
                    sigma=1.0,
                    dtype=x_flat.dtype,
                    device=x_flat.device,
                    backend=self.noise_backend,
                    prefetch=True,  # used out of place
                ),
                device=x_flat.device,
            )
        table, mean = state.table, state.table_mean
        stamp = getattr(table, "_privdl_saga_t", t)
        if stamp != t:
            raise ConfigError(
                f"this state (t = {t}) shares its SAGA table with a later step (t = {stamp}): "
                "the table is updated in place; step from the latest state, or clone the table "
                "(dataclasses.replace(state, table=state.table.clone())) to branch"
            )
        entry, loss = oracle.entries(z, xi)  # line 2: h at z
        h = oracle.expand(entry, xi).to(x_flat.dtype)
        if self.variance_reduction:
            table, mean = cast(Tensor, table), cast(Tensor, mean)  # init made both (the SAGA table)
            rows = torch.arange(n, device=xi.device)
            old = oracle.expand(table[rows, xi], xi).to(x_flat.dtype)
            g = h - old + mean.to(x_flat.dtype)  # line 3: old entry, old mean
            table[rows, xi] = entry.to(table.dtype)  # line 4, in place (see PrivSGPState)
            table._privdl_saga_t = t + 1  # type: ignore[attr-defined]
            every = self.refresh_every or j
            if (t + 1) % every == 0:
                mean = oracle.table_mean(table)
            else:
                mean = mean + ((h - old) / j).to(mean.dtype)
        else:
            g = h
        if pending is not None:
            g = g + sigma * pending()  # line 5
        half = unflatten_like(x_flat - gamma * g, state.x)  # line 6, applied to x
        x_new, w_new = comm.push_sum(half, state.w, t)  # lines 7-8
        new = replace(state, x=x_new, w=w_new, t=t + 1, table=table, table_mean=mean)
        return new, {"loss": loss, "gamma": gamma}


def describe_table(oracle: SampleOracle) -> str:
    """Human-readable size of the SAGA table (printed before training)."""
    b = table_bytes(oracle)
    return (
        f"{oracle.n_nodes} nodes x {oracle.n_entries} entries x {oracle.entry_size} floats "
        f"= {b / 2**20:.1f} MiB (float32)"
    )


# --------------------------------------------------------------------------- privacy
@dataclass(frozen=True)
class NoisePlan:
    """Per-node noise stds and what they are worth, from one calibration ``mode``."""

    mode: str
    sigmas: list[float]
    noise_multipliers: list[float]
    sensitivity: float
    steps: int
    sampling_rate: float
    notes: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "sigmas": self.sigmas,
            "noise_multipliers": self.noise_multipliers,
            "sensitivity": self.sensitivity,
            "steps": self.steps,
            "sampling_rate": self.sampling_rate,
            "notes": self.notes,
        }


def _per_node(x: float | Sequence[float], n: int | None) -> list[float]:
    if isinstance(x, int | float):
        return [float(x)] * (n or 1)
    return [float(v) for v in x]


PlanMode = Literal["nominal", "accounted", "poisson_approximation"]
_PLAN_MODES = ("nominal", "accounted", "poisson_approximation")


def _check_mode(mode: str) -> None:
    if mode not in _PLAN_MODES:
        raise PrivacyError(f"mode must be one of {', '.join(_PLAN_MODES)}; got {mode!r}")


def noise_plan(
    *,
    mode: PlanMode,
    gradient_bound: float,
    steps: int,
    local_samples: int,
    epsilons: float | Sequence[float],
    deltas: float | Sequence[float],
    c2: float = 1.0,
    variance_reduction: bool = True,
) -> NoisePlan:
    """sigma_i per node for a budget (eps_i, delta_i), one entry of J drawn per step.

    * ``nominal``: Theorem 2, eq. (11), ``sigma_i = (3)c2 G sqrt(K log(1/delta_i)) / (J eps_i)``
      (sensitivity 3G with VR, Appendix B; G without, our choice for Algorithm 2 of Appendix C) —
      the paper's heuristic, not a DP guarantee.
    * ``accounted``: what ``privdl run privsgp(-vr)`` calibrates to and its records certify
      (replace-one, example level, threat model ldp): with VR, K Gaussian steps of sensitivity
      (4 - 2/J) G and no amplification (the SAGA mean touches every sample); without, sensitivity
      2G and one entry of J drawn without replacement
      (:func:`privdl.accounting.nominal.privsgp_accounted_sigma`).
    * ``poisson_approximation``: the smallest noise multiplier z_i with RDP epsilon <= eps_i after
      K Poisson-subsampled steps at rate 1/J, add/remove, times 3G (G without VR) — the
      paper-style reading of Theorem 2 (docs/privsgp-vr.md), which no theorem certifies (the
      algorithm draws one sample, and the SAGA mean touches all of them).
    """
    # heavy: privdl.accounting loads dp_accounting, which the algorithm itself does not need
    from privdl.accounting import calibrate_nodes, privsgp_sigma
    from privdl.accounting.nominal import privsgp_accounted_sigma, privsgp_vr_sensitivity

    _check_mode(mode)
    n = None if isinstance(epsilons, int | float) else len(epsilons)
    n = n or (None if isinstance(deltas, int | float) else len(deltas))
    eps, dels = _per_node(epsilons, n), _per_node(deltas, n)
    if len(eps) != len(dels):
        raise PrivacyError("epsilons and deltas need one entry per node")
    rate = 1.0 / local_samples
    if mode == "nominal":
        sens = (3.0 if variance_reduction else 1.0) * gradient_bound
        sig = [
            privsgp_sigma(
                gradient_bound=gradient_bound,
                steps=steps,
                local_samples=local_samples,
                epsilon=e,
                delta=d,
                c2=c2,
            )
            * (1.0 if variance_reduction else 1.0 / 3.0)
            for e, d in zip(eps, dels, strict=True)
        ]
        notes = f"Theorem 2 eq. (11), c2={c2}: paper heuristic, not certified"
    elif mode == "accounted":
        if variance_reduction:
            sens = privsgp_vr_sensitivity(gradient_bound, entries=local_samples)
            rate = 1.0  # every step touches every sample: no amplification
            notes = (
                "K Gaussian steps (mu-GDP), no amplification, replace-one sensitivity (4-2/J)G, "
                "exact conversion: what privdl run privsgp-vr certifies"
            )
        else:
            sens = 2.0 * gradient_bound
            notes = (
                "subsampled RDP, one entry of J without replacement, replace-one sensitivity 2G: "
                "what privdl run privsgp certifies"
            )
        memo: dict[tuple[float, float], float] = {}
        for e, d in zip(eps, dels, strict=True):
            if (e, d) not in memo:
                memo[(e, d)] = privsgp_accounted_sigma(
                    clip=gradient_bound, steps=steps, delta=d, entries=local_samples,
                    epsilon=e, variance_reduction=variance_reduction,
                )  # fmt: skip
        sig = [memo[(e, d)] for e, d in zip(eps, dels, strict=True)]
    else:
        sens = (3.0 if variance_reduction else 1.0) * gradient_bound
        cache: dict[tuple[float, float], float] = {}
        for e, d in zip(eps, dels, strict=True):
            if (e, d) not in cache:
                cache[(e, d)] = calibrate_nodes(
                    epsilons=[e], deltas=d, sampling_rates=rate, steps=int(steps), accountant="rdp"
                )[0]  # the approximation as the paper-style reading defines it: RDP
        sig = [cache[(e, d)] * sens for e, d in zip(eps, dels, strict=True)]
        notes = "RDP accountant (dp-accounting), Poisson rate 1/J, add/remove: not certified"
    zs = [s / sens for s in sig]
    return NoisePlan(mode, sig, zs, sens, int(steps), rate, notes)


def optimal_steps(
    *,
    mode: PlanMode,
    A: float,
    local_samples: int,
    n: int,
    smoothness: float,
    dim: int,
    gradient_bound: float,
    epsilons: Sequence[float],
    deltas: Sequence[float],
    c2: float = 1.0,
    k_max: float = 1e8,
    grid: int = 25,
) -> tuple[float, float]:
    """K* and U(K*) (Corollary 1). ``nominal``: closed form eq. (12)-(13). Otherwise minimise
    ``U(K) = (A + 24 L d mean_i sigma_i(K)^2) / sqrt(nK)`` (eq. 14 with sigma_i(K) of ``mode``,
    see :func:`noise_plan`) over a log grid of K in [1, k_max], then refine between the grid
    neighbours (docs/privsgp-vr.md, "Privacy: nominal vs accounted"). ``poisson_approximation`` uses
    :func:`rdp_noise_multiplier` (integer orders, fast and slightly conservative next to
    dp-accounting); ``accounted`` the closed-form classic conversion of K Gaussian steps at
    sensitivity (4 - 2/J) G.
    """
    # heavy: privdl.accounting loads dp_accounting, which the algorithm itself does not need
    from privdl.accounting import privsgp_optimal_steps
    from privdl.accounting.nominal import privsgp_accounted_sigma

    _check_mode(mode)
    if mode == "nominal":
        return privsgp_optimal_steps(
            A=A,
            local_samples=local_samples,
            n=n,
            smoothness=smoothness,
            dim=dim,
            gradient_bound=gradient_bound,
            epsilons=epsilons,
            deltas=deltas,
            c2=c2,
        )
    if len(epsilons) != n or len(deltas) != n:
        raise PrivacyError("epsilons and deltas need one entry per node")

    cache: dict[int, float] = {}
    pairs = sorted(set(zip(epsilons, deltas, strict=True)))
    weight = {pr: sum(1 for p in zip(epsilons, deltas, strict=True) if p == pr) for pr in pairs}

    def sigma(pr: tuple[float, float], k: int) -> float:
        if mode == "accounted":
            return privsgp_accounted_sigma(
                clip=gradient_bound, steps=k, delta=pr[1], entries=local_samples, epsilon=pr[0]
            )
        return 3.0 * gradient_bound * rdp_noise_multiplier(pr[0], pr[1], 1.0 / local_samples, k)

    def u(k: float) -> float:
        k = max(1, round(k))
        if k not in cache:
            s2 = sum(weight[pr] * sigma(pr, k) ** 2 for pr in pairs) / n
            cache[k] = (A + 24.0 * smoothness * dim * s2) / math.sqrt(n * k)
        return cache[k]

    ks = [math.exp(math.log(k_max) * i / (grid - 1)) for i in range(grid)]
    us = [u(k) for k in ks]
    best = min(range(grid), key=us.__getitem__)
    lo, hi = math.log(ks[max(0, best - 1)]), math.log(ks[min(grid - 1, best + 1)])
    for _ in range(12):  # golden-section refinement on log K
        a = hi - (hi - lo) / 1.618
        b = lo + (hi - lo) / 1.618
        if u(math.exp(a)) <= u(math.exp(b)):
            hi = b
        else:
            lo = a
    k = float(max(1, round(math.exp((lo + hi) / 2))))
    return k, u(k)


# --------------------------------------------------------------------------- fast RDP (planner)
RDP_ORDERS = np.arange(2, 257)


def rdp_poisson_gaussian(q: float, z: float, orders: np.ndarray = RDP_ORDERS) -> np.ndarray:
    """RDP of one Poisson-subsampled Gaussian step at the (integer) ``orders`` (Mironov, Talwar &
    Zhang 2019): the project's one implementation, :func:`privdl.accounting.nominal.
    rdp_poisson_subsampled_gaussian`, which is vectorised and much faster than dp-accounting here."""
    # heavy: privdl.accounting loads dp_accounting, which the algorithm itself does not need
    from privdl.accounting.nominal import rdp_poisson_subsampled_gaussian

    return rdp_poisson_subsampled_gaussian(q, z, orders)[0]


def rdp_epsilon(
    q: float, z: float, steps: int, delta: float, *, conversion: str = "improved"
) -> float:
    """epsilon after ``steps`` compositions: classic ``K rdp + log(1/delta)/(a-1)`` or the improved
    ``K rdp + log((a-1)/a) - (log delta + log a)/(a-1)`` (Balle et al. 2020), minimised over a."""
    a = RDP_ORDERS.astype(float)
    r = steps * rdp_poisson_gaussian(q, z)
    if conversion == "classic":
        eps = r + (-math.log(delta)) / (a - 1)
    else:
        eps = r + np.log((a - 1) / a) - (math.log(delta) + np.log(a)) / (a - 1)
    return float(eps.min())


def rdp_noise_multiplier(
    epsilon: float, delta: float, q: float, steps: int, *, rtol: float = 1e-3
) -> float:
    """Smallest z (to ``rtol``, conservative side) with :func:`rdp_epsilon` <= ``epsilon``."""
    lo, hi = 0.05, 1.0
    while rdp_epsilon(q, hi, steps, delta) > epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise PrivacyError(f"no noise multiplier below 1e6 reaches epsilon {epsilon}")
    while hi / lo - 1 > rtol:
        mid = math.sqrt(lo * hi)
        if rdp_epsilon(q, mid, steps, delta) <= epsilon:
            hi = mid
        else:
            lo = mid
    return hi
