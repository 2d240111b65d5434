"""DECOR: decentralized SGD with pairwise-cancelling correlated noise (Allouah et al., ICML 2024).

One iteration for all nodes at once (Algorithm 1; matrix form Algorithm 4):

    g_i     = Clip(grad l(x_i, xi_i); C)                                  (line 2)
    v_ij    = -v_ji ~ N(0, sigma_cor^2 I), fresh at every t, from the edge secret s_ij
    vbar_i  ~ N(0, sigma_cdp^2 I), private to i                            (line 3)
    gt_i    = g_i + sum_{j in N_i} v_ij + vbar_i                           (eq. 3)
    x_i^1/2 = (1 - eta_t wd) x_i - eta_t gt_i                               (line 5)
    x_i^+   = sum_j W_ij x_j^1/2                                           (eq. 4)

The correlated part is ``N = K Z`` with ``K`` the signed incidence matrix, so ``sum_i N_i = 0``
structurally and the average evolves as ``xbar - (eta/n) sum_i (g_i + vbar_i)`` (eq. 33).
The edge secrets come from X25519 key agreement (:mod:`privdl.mechanisms.secrets`); only public
keys and model messages ever cross the communicator.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch

from privdl.algorithms.base import (
    Keys,
    StepInfo,
    StepSize,
    drawn_ahead,
    held_nodes,
    optimizer_buffers,
    optimizer_step,
)
from privdl.comm.base import Communicator
from privdl.engine.grads import ClipSpec
from privdl.errors import ConfigError
from privdl.mechanisms.correlated import decor_noise
from privdl.mechanisms.dealer import DealerCovariance
from privdl.mechanisms.discrete_gaussian import (
    grid_for,
    secure_edge_noise,
    secure_noise,
    snap,
    snap_clip,
)
from privdl.mechanisms.noise_design import NoiseDesign
from privdl.mechanisms.prng import NormalBackend
from privdl.tree import Tree, flatten, unflatten


@dataclass
class DecorState:
    """Stacked parameters, step counter, and the stream keys: the edge secrets (one per edge,
    None for edges no owned node is on) and each held row's noise key."""

    params: Tree
    t: int = 0
    edge_keys: tuple[bytes | None, ...] = field(default=(), repr=False)
    noise_keys: tuple[bytes, ...] = field(default=(), repr=False)
    #: the optimizer's per-node state (e.g. ``momentum/<leaf>``); empty for plain SGD
    opt: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Decor:
    """DECOR with clipping ``clip``, independent noise ``sigma_cdp`` and correlated ``sigma_cor``.

    ``edges`` is the ``(|E|, 2)`` edge array (``u < v``) of the communication graph.
    ``sigma_cor = 0`` gives the LDP baseline exactly (no correlated stream is drawn), and with
    ``sigma_cdp = 0`` too, D-SGD (:func:`privdl.algorithms.dsgd.DSGD`).
    """

    step_size: StepSize
    edges: object
    n_nodes: int
    clip: ClipSpec = ClipSpec()
    sigma_cdp: float = 0.0
    sigma_cor: float = 0.0
    weight_decay: float = 0.0
    noise_backend: NormalBackend = "auto"  # keyed Gaussian streams: prng.resolve_backend
    #: an optimizer of :mod:`privdl.optim` applied per node to the privatized gradient (None:
    #: plain SGD, ``x - eta (g + noise)`` with the decoupled ``weight_decay`` above)
    optimizer: Any = None
    #: "secure": the independent and the edges' noise are discrete Gaussians on a grid and the
    #: clipped gradient is snapped to it (:mod:`privdl.mechanisms.discrete_gaussian`)
    noise_mode: Literal["float", "secure", "secure-exact"] = "float"
    #: a variance per node and per edge instead of the two sigmas
    #: (:class:`~privdl.mechanisms.noise_design.NoiseDesign`, docs/noise-design.md), or a
    #: trusted dealer's covariance across nodes (:class:`~privdl.mechanisms.dealer.
    #: DealerCovariance`, Whisper D-SGD's noise; simulation only)
    noise_design: NoiseDesign | DealerCovariance | None = None
    #: on a CPU, start step t + 1's noise draw when step t takes its own
    #: (:func:`~privdl.algorithms.base.drawn_ahead`; the same values): on the idle 2-core CPU
    #: the MNIST step took 3.67x / 2.91x the non-private one (torus / ring) against 3.93x /
    #: 3.78x without (``benchmarks/bench_decor.py``); False draws during the gradients only
    draw_ahead: bool = True

    def __post_init__(self) -> None:
        if self.sigma_cdp < 0 or self.sigma_cor < 0:
            raise ConfigError("sigma_cdp and sigma_cor must be >= 0")
        if self.noise_mode != "float" and (self.sigma_cdp <= 0 or self.clip.threshold is None):
            raise ConfigError(
                "the secure noise mode adds independent noise (sigma_cdp > 0) to clipped gradients"
            )
        if self.weight_decay < 0:
            raise ConfigError(f"weight decay must be >= 0, got {self.weight_decay}")
        if self.noise_design is not None:
            self.noise_design.check_graph(self.edges, self.n_nodes)
            if self.noise_mode != "float":
                raise ConfigError("the secure noise modes have no noise design")

    def _noise_on(self) -> tuple[bool, bool]:
        """(correlated, independent): whether edge secrets / node noise keys are needed."""
        if self.noise_design is None:
            return self.sigma_cor > 0, self.sigma_cdp > 0
        if isinstance(self.noise_design, DealerCovariance):  # every node's own stream, mixed
            return False, True
        return bool(np.any(self.noise_design.edge_var > 0)), bool(
            np.any(self.noise_design.node_var > 0)
        )

    def init(self, params: Tree, oracle: object, comm: Communicator, *, keys: Keys) -> DecorState:
        """Agree the per-edge secrets (X25519 + HKDF over ``comm.key_transport``: only public
        keys travel) and derive the owned nodes' noise keys (paper Section 2, the setup round).

        ``keys`` from the OS is a deployment; from a seed, a reproducible simulation (insecure,
        see :func:`privdl.mechanisms.agree_edge_secrets`).
        """
        nodes = held_nodes(comm, params)
        if isinstance(self.noise_design, DealerCovariance) and len(nodes) != self.n_nodes:
            raise ConfigError(
                "a dealer's covariance is simulated in one process holding every node "
                f"(this one holds {len(nodes)} of {self.n_nodes})"
            )
        edge_keys: tuple[bytes | None, ...] = ()
        correlated, independent = self._noise_on()
        if correlated:
            edge_keys = keys.edge_keys(self.edges, self.n_nodes, comm)
        noise_keys = keys.node_noise_keys(nodes) if independent else ()
        opt = optimizer_buffers(self.optimizer, params)
        return DecorState(params, 0, edge_keys=edge_keys, noise_keys=noise_keys, opt=opt)

    def _inner_clip(self, size: int) -> ClipSpec:
        """Clip at ``C - gamma sqrt(d) / 2``: the snapped gradient has norm at most ``C``."""
        grid = grid_for(self.sigma_cdp)
        assert self.clip.threshold is not None  # __post_init__
        return replace(self.clip, threshold=snap_clip(self.clip.threshold, grid, size))

    def _secure_gradients(
        self, grads: Tree, state: DecorState, t: int, size: int, owned: list[int]
    ) -> Tree:
        """``gamma round(g / gamma) + gamma N_Z(0, (sigma/gamma)^2)`` plus, with ``sigma_cor``,
        the edges' ``+-gamma N_Z(0, (sigma_cor/gamma)^2)``: exact in float64 (every term a
        multiple of the power-of-two grid), then cast (post-processing)."""
        grid = grid_for(self.sigma_cdp)
        flat = flatten(grads)
        exact = self.noise_mode == "secure-exact"
        noise = secure_noise(
            list(state.noise_keys), t, size, sigma=self.sigma_cdp, device=flat.device, exact=exact
        )
        if self.sigma_cor > 0:
            noise = noise + secure_edge_noise(
                state.edge_keys, self.edges, self.n_nodes, t, size, sigma_cor=self.sigma_cor,
                grid=grid, nodes=None if len(owned) == self.n_nodes else owned,
                device=flat.device, exact=exact,
            )  # fmt: skip
        return unflatten((snap(flat, grid) + noise).to(flat.dtype), grads)

    def step(self, state: DecorState, oracle, comm: Communicator) -> tuple[DecorState, StepInfo]:
        t = state.t
        eta = self.step_size(t)
        first = next(iter(state.params.values()))
        size = sum(v[0].numel() for v in state.params.values())
        owned = comm.owned_list

        def draw(step: int) -> torch.Tensor | None:  # line 3: the keys and t only, not g_i
            return decor_noise(
                state.edge_keys,
                self.edges,
                self.n_nodes,
                list(state.noise_keys),
                step,
                size,
                sigma_cor=self.sigma_cor,
                sigma_cdp=self.sigma_cdp,
                dtype=first.dtype,
                device=first.device,
                nodes=None if len(owned) == self.n_nodes else owned,
                backend=self.noise_backend,
                prefetch=True,  # used out of place below
                design=self.noise_design,
            )

        if self.noise_mode != "float":  # lines 2-3 on the grid (docs/security.md s.4)
            res = oracle(state.params, t, clip=self._inner_clip(size))
            grads = self._secure_gradients(res.grads, state, t, size, owned)
            flat = None
        else:
            # drawn while line 2 runs; on a CPU started during the previous step
            owner = (self, comm, state.edge_keys, state.noise_keys, first.dtype)
            noisy = any(self._noise_on())  # D-SGD draws nothing: no worker round trip
            pending = (
                drawn_ahead(owner, t, draw, device=first.device, ahead=self.draw_ahead)
                if noisy
                else lambda: None
            )
            res = oracle(state.params, t, clip=self.clip)  # line 2
            grads = res.grads
            flat = pending()
        if flat is not None:
            noise = unflatten(flat, grads)
            added = torch._foreach_add(list(grads.values()), [noise[k] for k in grads])
            grads = dict(zip(grads, added, strict=True))  # one launch on CUDA
        opt = state.opt
        if self.optimizer is None:
            # x - eta g (times 1 - eta wd first, if any) as foreach ops: one launch per
            # operation on a GPU instead of one per leaf, the same elementwise arithmetic
            names = list(grads)
            xs = [state.params[k] for k in names]
            if self.weight_decay:
                xs = list(torch._foreach_mul(xs, 1.0 - eta * self.weight_decay))
            if flat is not None:  # the sums above are this step's own tensors: the same
                # products written over them instead of into new tensors
                steps = [grads[k] for k in names]
                torch._foreach_mul_(steps, eta)
            else:
                steps = list(torch._foreach_mul([grads[k] for k in names], eta))
            half = dict(zip(names, torch._foreach_sub(xs, steps), strict=True))
        else:  # post-processing of the privatized gradient: the accounting is unchanged
            half, opt = optimizer_step(self.optimizer, grads, opt, state.params, t=t, lr=eta)
        return replace(state, params=comm.mix(half, t), t=t + 1, opt=opt), {"loss": res.loss}
