"""Baselines of PrivSGP-VR's Figs 5 and 10: DP2-SGD and A(DP)2SGD on an undirected graph.

The PrivSGP-VR paper only names them (Section 5, Figs 5 and 10); the choices made here are
documented in ``docs/privsgp-vr.md``. Both draw one entry (sample or block) per node per step from
the same :class:`~privdl.algorithms.privsgp.SampleOracle` as PrivSGP-VR, clip per sample through the
oracle, and add per-node Gaussian noise ``N(0, sigma_i^2 I)`` to the stochastic gradient.

DP2-SGD (Yu et al. 2021): D-PSGD (Lian et al. 2017) with Gaussian gradient noise,

    x_i^{k+1} = sum_j W_ij x_j^k - gamma (grad f_i(x_i^k; xi_i^k) + N_i^k)

with a static doubly stochastic ``W`` (ring: 1/3 on self, left, right). The gradient is taken at
the pre-gossip model, as in D-PSGD.

A(DP)2SGD (Xu et al. 2021): AD-PSGD (Lian et al. 2018) with Gaussian gradient noise. An
asynchronous run is simulated in synchronous ticks: at tick k a random matching of the graph's
edges is drawn (on a ring: the even or the odd edges, at random, each kept with prob. 1/2), each
matched pair averages its models, and every node then applies the noisy gradient computed on its
model from BEFORE the averaging (one step of staleness, as in AD-PSGD):

    v_i = grad f_i(x_i^k; xi) + N_i;   x^{k+1/2} = W_k x^k;   x_i^{k+1} = x_i^{k+1/2} - gamma v_i
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp
import torch

from privdl.algorithms.base import Keys, StepInfo, StepSize, held_nodes
from privdl.algorithms.privsgp import SampleOracle, _sample_index
from privdl.comm.base import Communicator
from privdl.errors import GraphError, PrivacyError
from privdl.mechanisms.correlated import independent_noise
from privdl.mechanisms.prng import NormalBackend
from privdl.topology.mixing import MixingMatrix
from privdl.tree import Tree, flatten
from privdl.tree import unflatten as unflatten_like


@dataclass
class GossipState:
    """Stacked parameters, step counter, sampling seed and the per-node noise keys."""

    params: Tree
    t: int = 0
    seed: int = 0
    noise_keys: tuple[bytes, ...] = field(default=(), repr=False)


def ring_matching(n: int, t: int, *, seed: int) -> MixingMatrix:
    """A(DP)2SGD tick ``t`` on the ring: random disjoint pairs average their models.

    Pairs ``(o + 2m, o + 2m + 1) mod n`` for ``m < n // 2`` with a random offset ``o``, each kept
    with probability 1/2; symmetric and doubly stochastic; a function of ``(seed, t)`` only.
    """
    if n < 2:
        raise GraphError("A(DP)2SGD needs at least 2 nodes")
    rng = np.random.default_rng([int(seed), int(t), 0xAD92])
    first = (int(rng.integers(n)) + 2 * np.arange(n // 2)) % n
    first = first[rng.random(len(first)) < 0.5]
    second = (first + 1) % n
    paired = np.zeros(n, dtype=bool)
    paired[first] = paired[second] = True
    alone = np.flatnonzero(~paired)
    rows = np.concatenate([first, second, first, second, alone])
    cols = np.concatenate([first, second, second, first, alone])
    vals = np.concatenate([np.full(4 * len(first), 0.5), np.ones(len(alone))])
    return MixingMatrix("ring-matching", sp.csr_matrix((vals, (rows, cols)), shape=(n, n)))


@dataclass(frozen=True)
class DP2SGD:
    """DP2-SGD (``asynchronous=False``) or A(DP)2SGD (``asynchronous=True``) with noise ``sigmas``.

    The update is the same for both; what differs is the communicator's schedule: a static
    doubly stochastic ``W`` (DP2-SGD) or :func:`ring_matching` (A(DP)2SGD). ``asynchronous`` only
    names the variant (:attr:`name`), so records say which baseline ran.
    """

    step_size: StepSize
    sigmas: float | Sequence[float] = 0.0
    asynchronous: bool = False
    noise_backend: NormalBackend = "auto"  # keyed Gaussian streams: prng.resolve_backend

    def __post_init__(self) -> None:
        sig = [self.sigmas] if isinstance(self.sigmas, int | float) else list(self.sigmas)
        if any(not (math.isfinite(s) and s >= 0) for s in sig):
            raise PrivacyError(f"noise stds must be finite and >= 0, got {self.sigmas}")

    @property
    def name(self) -> str:
        return "A(DP)2SGD" if self.asynchronous else "DP2-SGD"

    def init(
        self, params: Tree, oracle: SampleOracle, comm: Communicator, *, keys: Keys
    ) -> GossipState:
        """``x^0``, the sampling seed of the entries ``xi`` and a noise key per node (one process:
        the matchings of A(DP)2SGD are global)."""
        nodes = held_nodes(comm, params)
        if len(nodes) != comm.n_nodes:
            raise PrivacyError(f"{self.name} runs in one process (its matchings are global)")
        return GossipState(dict(params), 0, keys.sampling_seed, keys.node_noise_keys(nodes))

    def step(
        self, state: GossipState, oracle: SampleOracle, comm: Communicator
    ) -> tuple[GossipState, StepInfo]:
        t, gamma = state.t, self.step_size(state.t)
        x = flatten(state.params)
        n = x.shape[0]
        xi = _sample_index(state.seed, t, n, oracle.n_entries, x.device)
        entry, loss = oracle.entries(state.params, xi)
        g = oracle.expand(entry, xi).to(x.dtype)
        if isinstance(self.sigmas, int | float):
            sigma = torch.full((n, 1), float(self.sigmas), dtype=x.dtype, device=x.device)
        else:
            sigma = torch.as_tensor(list(self.sigmas), dtype=x.dtype, device=x.device)[:, None]
        if bool((sigma > 0).any()):
            noise = independent_noise(
                state.noise_keys,
                t,
                x.shape[1],
                sigma=1.0,
                dtype=x.dtype,
                device=x.device,
                backend=self.noise_backend,
            )
            g = g + sigma * noise
        mixed = flatten(comm.mix(state.params, t))
        new = unflatten_like(mixed - gamma * g, state.params)
        return replace(state, params=new, t=t + 1), {"loss": loss, "gamma": gamma}
