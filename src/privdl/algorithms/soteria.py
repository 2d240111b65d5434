"""SoteriaFL-SGD (Li, Zhao, Li, Chi 2022): server/client DP-SGD with shifted compression.

PORTER's baseline (Section 5; docs/porter.md). All clients share the server model ``x``; one round::

    g_i  = Clip_tau(grad l(x; z_i)) + e_i,   e_i ~ N(0, sigma_p^2 I)     (client, b = 1)
    c_i  = C(g_i - s_i)                                                   (compressed uplink)
    s_i <- s_i + gamma_s c_i                                              (local shift, s_i^0 = 0)
    c    = (1/n) sum_i c_i                                                (server)
    x   <- x - eta (s + c),   s <- s + gamma_s c                          (s = mean_i s_i)

``s + c`` is the server's estimate of the mean noisy gradient (DIANA-style shifts). The authors
use ``gamma_s = sqrt((1 + 2 omega) / (2 (1 + omega)^3))`` with ``omega = d/k - 1``
(:func:`shift_step`). Only the uplink is counted in bits (the downlink broadcast is not, as in
the authors' accounting). The model is kept stacked ``(n, ...)`` (identical rows, the broadcast
copies) so the same task oracles serve both this and the decentralized algorithms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from privdl.algorithms.base import Keys, StepInfo, StepSize, held_nodes
from privdl.algorithms.porter import channel_generator
from privdl.comm.base import Communicator
from privdl.engine.grads import ClipSpec
from privdl.errors import ConfigError
from privdl.mechanisms.compress import Compressor, Identity
from privdl.mechanisms.correlated import independent_noise
from privdl.mechanisms.prng import NormalBackend
from privdl.tree import Tree, unflatten
from privdl.tree import flatten as flatten_tree

__all__ = ["SoteriaFL", "SoteriaState", "shift_step"]


def shift_step(*, omega: float) -> float:
    """The SoteriaFL notebooks' shift step ``sqrt((1 + 2 omega) / (2 (1 + omega)^3))``."""
    if not omega >= 0:
        raise ConfigError(f"compressor variance omega must be >= 0, got {omega}")
    return math.sqrt((1.0 + 2.0 * omega) / (2.0 * (1.0 + omega) ** 3))


@dataclass
class SoteriaState:
    """Server model (stacked broadcast copies), client shifts ``s_i`` ``(n, P)``, server shift
    ``s`` ``(P,)`` (equal to ``mean_i s_i``), round counter and the clients' noise keys."""

    params: Tree
    shifts: torch.Tensor
    server_shift: torch.Tensor
    t: int = 0
    seed: int = 0
    noise_keys: tuple[bytes, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class SoteriaFL:
    """SoteriaFL-SGD with step ``step_size`` (eta), shift step ``gamma_s``, compressor, clipping
    ``clip`` (per-sample for the private version) and Gaussian noise ``sigma_p``."""

    step_size: StepSize
    gamma_s: float
    compressor: Compressor = field(default_factory=Identity)
    clip: ClipSpec = ClipSpec()
    sigma_p: float = 0.0
    name: str = "soteriafl-sgd"
    noise_backend: NormalBackend = "auto"  # keyed Gaussian streams: prng.resolve_backend

    def __post_init__(self) -> None:
        if not 0.0 < self.gamma_s <= 1.0:
            raise ConfigError(f"shift step gamma_s must be in (0, 1], got {self.gamma_s}")
        if not self.sigma_p >= 0.0 or self.sigma_p == float("inf"):
            raise ConfigError(f"sigma_p must be a finite number >= 0, got {self.sigma_p}")

    def init(self, params: Tree, oracle: object, comm: Communicator, *, keys: Keys) -> SoteriaState:
        """Every client holds the server model; shifts start at 0; ``keys.seed`` draws the
        compression masks (public randomness) and, with noise, each client gets a stream key."""
        nodes = held_nodes(comm, params)
        if len(nodes) != comm.n_nodes:
            raise ConfigError("SoteriaFL-SGD runs in one process (its server sees every client)")
        x = flatten_tree(params)
        if x.shape[0] > 1 and not bool((x == x[:1]).all()):
            raise ConfigError("SoteriaFL clients all hold the server model: rows must be equal")
        noise_keys = keys.node_noise_keys(nodes) if self.sigma_p > 0 else ()
        return SoteriaState(
            params=params,
            shifts=torch.zeros_like(x),
            server_shift=torch.zeros_like(x[0]),
            t=0,
            seed=keys.seed,
            noise_keys=noise_keys,
        )

    def step(
        self, state: SoteriaState, oracle, comm: Communicator
    ) -> tuple[SoteriaState, StepInfo]:
        """One round: clients' noisy clipped gradients, shifted compressed uplink, server step."""
        t = state.t
        eta = self.step_size(t)
        res = oracle(state.params, t, clip=self.clip)
        g = flatten_tree(res.grads).to(state.shifts.dtype)
        if self.sigma_p > 0:
            keys = list(state.noise_keys)  # one per held row
            g = g + independent_noise(
                keys,
                t,
                g.shape[1],
                sigma=self.sigma_p,
                dtype=g.dtype,
                device=g.device,
                backend=self.noise_backend,
            )
        gen = channel_generator(state.seed, "uplink", t, g.device)
        c_i = self.compressor(g - state.shifts, generator=gen)
        shifts = state.shifts + self.gamma_s * c_i
        c = comm.average({"c": c_i})["c"]  # server aggregation
        x = flatten_tree(state.params)[0]
        x_new = x - eta * (state.server_shift + c)
        server_shift = state.server_shift + self.gamma_s * c
        if not bool(torch.isfinite(x_new).all()):
            raise ConfigError(f"{self.name} diverged at round {t}: lower eta")
        stacked = x_new.unsqueeze(0).expand(g.shape[0], -1).clone()  # broadcast downlink
        new = replace(
            state,
            params=unflatten(stacked, state.params),
            shifts=shifts,
            server_shift=server_shift,
            t=t + 1,
        )
        info = {"loss": res.loss, "bits_per_node": int(self.compressor.bits(g.shape[1])), "g_p": g}
        return new, info
