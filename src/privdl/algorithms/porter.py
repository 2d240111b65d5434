"""PORTER (Li & Chi): decentralized gradient tracking with compressed surrogates, and BEER.

One iteration for all agents at once (Algorithm 1; docs/porter.md). Node-major layout:
rows are agents, so the paper's right multiplication ``Q (W - I)`` is ``(W - I) Q`` here, which is
``comm.mix(Q) - Q`` for the symmetric ``W`` the analysis needs (Lemma 1)::

    G_p^t = Clip-and-noise gradients at X^{t-1}                  (6)-(7) DP / (9)-(10) GC
    Q_v^t = Q_v^{t-1} + C(V^{t-1} - Q_v^{t-1})                   (11)  [compressed, channel v]
    V^t   = V^{t-1} + gamma (W - I) Q_v^t + G_p^t - G_p^{t-1}    (12)  [gradient tracking]
    Q_x^t = Q_x^{t-1} + C(X^{t-1} - Q_x^{t-1})                   (13)  [compressed, channel x]
    X^t   = X^{t-1} + gamma (W - I) Q_x^t - eta V^t              (14)

Variants (:func:`porter_dp`, :func:`porter_gc`, :func:`beer`) differ only in the gradient:

* PORTER-DP: per-sample clipping (smooth by default, eq. (5)), mean, plus ``N(0, sigma_p^2 I)``;
* PORTER-GC: clip the minibatch mean, no noise;
* BEER: no clipping, no noise (tau -> infinity, sigma_p = 0).

``G_p^{t-1}`` in (12) is the STORED previous noisy gradient (``state.g_prev``), never redrawn:
fresh noise there would break the tracking invariant ``mean_i v_i = mean_i g_{p,i}``.

Naming: PORTER's ``alpha`` is the graph mixing rate; the compressor parameter is rho
(``compressor.contraction(P)``); ``gamma`` is the consensus step size. Randomness: the privacy
noise of agent i at round t is ``independent_noise(key_i, t)``; the compressor masks of round t
come from a generator keyed by ``(seed, channel, t)``, with independent rows (agents), so runs
are reproducible and resumable from the state alone.

Sharded runs (``torch.distributed``, docs/distributed.md): ``init(params, seed=, nodes=)`` takes
the rows of the global agents ``nodes`` and derives their noise keys from the global ids, so an
agent's noise does not depend on which process holds it. The compressor masks are drawn for all
``n`` agents (a zero-padded ``(n, P)`` message; each row is compressed independently) and the
held rows kept: the masks equal the simulator's at the cost of an ``(n, P)`` draw per channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from privdl.algorithms.base import Keys, StepInfo, StepSize, held_nodes, in_background
from privdl.comm.base import Communicator
from privdl.engine.grads import ClipSpec
from privdl.errors import ConfigError
from privdl.mechanisms.compress import Compressor, Identity
from privdl.mechanisms.correlated import independent_noise
from privdl.mechanisms.prng import NormalBackend
from privdl.rng import step_generator
from privdl.topology.mixing import MixingMatrix, best_constant_mixing, fdla_mixing
from privdl.tree import Tree, unflatten
from privdl.tree import flatten as flatten_tree

__all__ = [
    "Porter",
    "PorterState",
    "beer",
    "best_constant_mixing",
    "fdla_mixing",
    "flatten_tree",
    "mixing_rate",
    "porter_dp",
    "porter_gc",
]


def channel_generator(seed: int, channel: str, t: int, device: torch.device) -> torch.Generator:
    """Compressor randomness of one channel at round ``t``: independent across channels/rounds."""
    return step_generator(seed, f"compress/{channel}", t, device=device)


@dataclass
class PorterState:
    """Explicit state of Algorithm 1 (flat ``(n, P)`` tensors; ``params`` is X as a tree).

    ``q_x``/``q_v`` are the compressed surrogates, ``v`` the gradient tracker and ``g_prev`` the
    stored noisy gradient ``G_p^{t-1}`` (including its noise realisation). Rows are the agents
    ``nodes`` (global ids; all agents in the simulator); ``noise_keys[r]`` is row r's key.
    """

    params: Tree
    q_x: torch.Tensor
    v: torch.Tensor
    q_v: torch.Tensor
    g_prev: torch.Tensor
    t: int = 0
    seed: int = 0
    noise_keys: tuple[bytes, ...] = field(default=(), repr=False)
    nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Porter:
    """PORTER / BEER with gradient step ``step_size`` (eta), consensus step ``gamma``, compressor
    ``compressor`` (rho = its contraction), clipping ``clip`` and privacy noise ``sigma_p``."""

    step_size: StepSize
    gamma: float
    compressor: Compressor = field(default_factory=Identity)
    clip: ClipSpec = ClipSpec()
    sigma_p: float = 0.0
    name: str = "porter"
    noise_backend: NormalBackend = "auto"  # keyed Gaussian streams: prng.resolve_backend

    def __post_init__(self) -> None:
        if not 0.0 < self.gamma <= 1.0:
            raise ConfigError(f"consensus step size gamma must be in (0, 1], got {self.gamma}")
        if not self.sigma_p >= 0.0 or self.sigma_p == float("inf"):
            raise ConfigError(f"sigma_p must be a finite number >= 0, got {self.sigma_p}")

    def init(self, params: Tree, oracle: object, comm: Communicator, *, keys: Keys) -> PorterState:
        """Algorithm 1's init: ``Q_x = X^0``, ``V = Q_v = G_p = 0``; all agents share ``X^0``.

        ``params`` holds the rows of the agents ``comm`` owns; the noise keys are derived for
        those global ids, so a sharded run draws the same noise as the simulator. ``keys.seed``
        draws the compressor masks (public randomness).
        """
        x = flatten_tree(params)
        if x.shape[0] > 1 and not bool((x == x[:1]).all()):
            raise ConfigError("PORTER starts every agent at the same point x_bar^(0)")
        held = held_nodes(comm, params)
        noise_keys = keys.node_noise_keys(held) if self.sigma_p > 0 else ()
        zeros = torch.zeros_like(x)
        return PorterState(
            params=params,
            q_x=x.clone(),
            v=zeros,
            q_v=zeros.clone(),
            g_prev=zeros.clone(),
            t=0,
            seed=keys.seed,
            noise_keys=noise_keys,
            nodes=held,
        )

    def gradients(
        self, state: PorterState, oracle, comm: Communicator
    ) -> tuple[torch.Tensor, Any]:  # the oracle's result (an engine.GradResult)
        """``G_p^t`` at ``X^{t-1}``: the oracle's clipped gradients plus agent-keyed noise (7)."""
        pending = None
        if self.sigma_p > 0:  # (7)'s noise needs only the keys and t: drawn while the oracle runs
            keys = list(state.noise_keys)  # one per held row (init derives them for ``nodes``)
            pending = in_background(
                lambda: independent_noise(
                    keys,
                    state.t,
                    state.v.shape[1],
                    sigma=self.sigma_p,
                    dtype=state.v.dtype,
                    device=state.v.device,
                    backend=self.noise_backend,
                    prefetch=True,  # used out of place
                ),
                device=state.v.device,
            )
        res = oracle(state.params, state.t, clip=self.clip)
        g = flatten_tree(res.grads).to(state.v.dtype)
        if pending is not None:
            if len(keys) != g.shape[0]:
                raise ConfigError(
                    f"{len(keys)} noise keys for {g.shape[0]} agents: init the state with this communicator"
                )
            g = g + pending()
        return g, res

    def step(self, state: PorterState, oracle, comm: Communicator) -> tuple[PorterState, StepInfo]:
        """One round of Algorithm 1 (steps (4)-(14)); ``info['bits_per_node']`` = 2 messages."""
        t = state.t
        eta = self.step_size(t)
        g_p, res = self.gradients(state, oracle, comm)
        x = flatten_tree(state.params)
        dev = x.device

        def gossip(q: torch.Tensor) -> torch.Tensor:  # (W - I) Q, symmetric W
            return comm.mix({"q": q}, t)["q"] - q

        def compress(m: torch.Tensor, channel: str) -> torch.Tensor:
            gen = channel_generator(state.seed, channel, t, dev)
            if m.shape[0] == comm.n_nodes:
                return self.compressor(m, generator=gen)
            # A shard: compress the zero-padded (n, P) message of all agents (rows are
            # compressed independently) and keep the held rows, so the masks of agent i are
            # the simulator's whatever process holds it (cost: an (n, P) draw per channel).
            rows = comm.owned.to(dev)
            full = m.new_zeros((comm.n_nodes, m.shape[1])).index_copy_(0, rows, m)
            return self.compressor(full, generator=gen).index_select(0, rows)

        q_v = state.q_v + compress(state.v - state.q_v, "v")  # (11)
        v = state.v + self.gamma * gossip(q_v) + g_p - state.g_prev  # (12)
        c_x = compress(x - state.q_x, "x")
        q_x = state.q_x + c_x  # (13)
        x_new = x + self.gamma * gossip(q_x) - eta * v  # (14)
        if not bool(torch.isfinite(x_new).all()):
            raise ConfigError(
                f"{self.name} diverged at round {t} (non-finite iterates): lower gamma or eta"
            )
        new = replace(
            state, params=unflatten(x_new, state.params), q_x=q_x, v=v, q_v=q_v, g_prev=g_p, t=t + 1
        )
        info = {
            "loss": res.loss,
            "bits_per_node": 2 * int(self.compressor.bits(x.shape[1])),
            "g_p": g_p,
        }
        return new, info


def _eta(step_size: StepSize | float) -> StepSize:
    return step_size if isinstance(step_size, StepSize) else StepSize(float(step_size))


def porter_dp(
    *,
    step_size: StepSize | float,
    gamma: float,
    compressor: Compressor,
    tau: float,
    sigma_p: float,
    clip_kind: str = "smooth",
) -> Porter:
    """PORTER-DP (Option I, eqs. (6)-(7)): per-sample ``Clip_tau`` then ``+ N(0, sigma_p^2 I)``."""
    clip = ClipSpec(mode="per_sample", threshold=tau, kind=clip_kind)  # type: ignore[arg-type]
    return Porter(_eta(step_size), gamma, compressor, clip, sigma_p, name="porter-dp")


def porter_gc(
    *,
    step_size: StepSize | float,
    gamma: float,
    compressor: Compressor,
    tau: float,
    clip_kind: str = "smooth",
) -> Porter:
    """PORTER-GC (Option II, eqs. (9)-(10)): ``Clip_tau`` of the minibatch mean, no noise."""
    clip = ClipSpec(mode="batch_mean", threshold=tau, kind=clip_kind)  # type: ignore[arg-type]
    return Porter(_eta(step_size), gamma, compressor, clip, 0.0, name="porter-gc")


def beer(*, step_size: StepSize | float, gamma: float, compressor: Compressor) -> Porter:
    """BEER (Zhao et al. 2022) in PORTER's form: no clipping and no noise (PORTER Section 3)."""
    return Porter(_eta(step_size), gamma, compressor, ClipSpec(), 0.0, name="beer")


# ----------------------------------------------------------- mixing matrices (Definition 1, §5)


def mixing_rate(w: MixingMatrix) -> float:
    """PORTER Definition 1: ``alpha = ||W - J||_2`` (the MIXING RATE, not a compressor knob)."""
    n = w.n
    return float(np.linalg.norm(w.dense() - np.full((n, n), 1.0 / n), 2))
