"""White-box audits of the noisy-gossip family: DECOR (Allouah et al., ICML 2024, Algorithm 1) and
its LDP, CDP and DP-SGD baselines, run as implemented.

The mechanism is the algorithm's own ``step`` (:class:`privdl.algorithms.decor.Decor`: clipped
gradient, keyed noise streams, X25519 edge secrets, the run's communicator), built by the same
recipe as a training run (:func:`privdl.loop.build_run`, so the noise is calibrated to the target
epsilon exactly as ``privdl run`` calibrates it). Only the task is replaced: a white-box
*gradient canary* oracle hands the canary node the gradient ``w s_t C`` at step ``t`` (``C`` the
clipping threshold, ``s_t = +-1`` a public pseudo-random pattern, ``w = -1`` or ``+1`` the two
neighbouring worlds: replace-one, a shift of ``2C`` per step, the accountant's sensitivity at
user level) and every other node zero. Each trial is one coordinate of the models: the keyed
streams draw every coordinate independently, so a batch of ``B`` trials is one run of the step on
``(n, B)`` models (no loop over trials; batches of trials use different keys).

What the adversary sees, per threat model (DECOR Section 3, SecLDP):

* ``eavesdropper`` and ``ldp``: every message ``x_i^{t+1/2}`` on the wire, all nodes, all steps;
* ``curious`` / ``collusion:Q``: the messages the colluders (the accountant's worst set ``I``)
  receive from their neighbours, their own messages, and the noise ``v_ij`` of every edge they
  are on, rebuilt from their shared secrets with the same keyed streams (so the test can subtract
  it); the canary is the accountant's worst honest node;
* ``central`` (CDP, DP-SGD): the released model after exact averaging, every step.

The test is a linear score fitted on held-out trials (:mod:`privdl.audit.scores`), the lower bound
is computed on the other trials (:mod:`privdl.audit.estimators`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from privdl.accounting.secrdp import decor_step_rdp
from privdl.algorithms.base import Keys
from privdl.algorithms.decor import Decor
from privdl.algorithms.porter import Porter
from privdl.comm.base import Communicator
from privdl.engine.grads import GradResult
from privdl.errors import ConfigError
from privdl.mechanisms.correlated import correlated_noise
from privdl.mechanisms.secrets import as_edge_array
from privdl.tree import Tree

__all__ = ["GossipView", "canary_views", "gossip_view", "observe"]

#: Largest trials x features matrix one audit holds (float64): 400 MB.
MAX_CELLS = 50_000_000


@dataclass(frozen=True)
class GossipView:
    """What one threat model's adversary observes of a gossip run (module docstring)."""

    threat_model: str
    canary: int
    #: rows of the half-step messages x^{t+1/2} it sees (empty for ``central``)
    message_rows: tuple[int, ...]
    #: (edge index, colluder row) of every edge whose noise it rebuilds from its own secret
    secret_edges: tuple[tuple[int, int], ...] = ()
    #: whether it sees the released (mixed) model instead of messages (a trusted aggregator)
    released: bool = False
    colluders: tuple[int, ...] = ()
    #: messages each node sends per step (PORTER: two channels, Q_v and Q_x)
    channels: int = 1

    def describe(self) -> str:
        if self.channels == 2:
            return (
                f"node {self.canary}'s messages (its compressed surrogates Q_v and Q_x), every step"
            )
        if self.released:
            return "the released model after exact averaging, every step"
        if not self.colluders:
            return "every message x_i^{t+1/2} on the wire, every step"
        return (
            f"colluders {list(self.colluders)}: their own and their neighbours' messages, every "
            f"step, and the noise of their {len(self.secret_edges)} edges (their secrets)"
        )

    def features_per_step(self) -> int:
        if self.released:
            return 1
        return self.channels * len(self.message_rows) + len(self.secret_edges)


def gossip_view(run: Any) -> GossipView:
    """The adversary of ``run``'s threat model and the node that holds the canary: DECOR's
    accountant's worst colluding set and worst honest node (Algorithm 3), node 0 otherwise."""
    alg = run.algorithm
    n = int(run.topology.n)
    if isinstance(alg, Porter):  # PORTER-DP: LDP noise; what the canary's node sends
        return GossipView("ldp", 0, (0,), channels=2)
    noise = getattr(run.recipe, "noise", None)
    if noise == "central":
        return GossipView("central", 0, (), released=True)
    if noise == "local":
        return GossipView("ldp", 0, tuple(range(n)))
    adversary = str(run.cfg.adversary)
    step = decor_step_rdp(
        run.topology.graph,
        sigma_cdp=float(alg.sigma_cdp),
        sigma_cor=float(alg.sigma_cor),
        clip=float(alg.clip.threshold),
        adversary=adversary,
    )
    colluders = tuple(int(i) for i in step.worst_colluders)
    canary = int(step.worst_node)
    if not colluders:
        return GossipView(step.adversary, canary, tuple(range(n)))
    edges = as_edge_array(alg.edges, n)
    coll = set(colluders)
    seen = set(colluders)
    secret: list[tuple[int, int]] = []
    for e, (u, v) in enumerate(edges.tolist()):  # setup: the colluders' edges, once
        if u in coll or v in coll:
            seen.update((u, v))
            if alg.sigma_cor > 0:
                secret.append((e, u if u in coll else v))
    return GossipView(step.adversary, canary, tuple(sorted(seen)), tuple(secret), False, colluders)


class _CanaryOracle:
    """The task of an audit: the canary node's gradient is ``world * s_t * C`` per trial."""

    def __init__(self, n: int, canary: int, clip: float, signs: np.ndarray, world: torch.Tensor):
        self.n, self.canary, self.clip = n, canary, clip
        self.signs, self.world = signs, world

    def __call__(self, params: Tree, t: int, *, clip: Any) -> GradResult:
        w = params["w"]
        g = torch.zeros_like(w)
        g[self.canary] = self.world.to(w.dtype) * float(self.signs[t] * self.clip)
        return GradResult({"w": g}, torch.zeros(self.n, dtype=w.dtype))


class _Recording:
    """The run's communicator, keeping the messages it was given and what it returned since the
    last :meth:`take` (what an observer of the wire, or of a trusted aggregator's output, sees)."""

    def __init__(self, inner: Communicator) -> None:
        self._inner = inner
        self.sent: list[torch.Tensor] = []
        self.received: list[torch.Tensor] = []

    def mix(self, tree: Tree, t: int) -> Tree:
        (value,) = tree.values()  # the audit's models are one tensor
        self.sent.append(value.detach().clone())
        out = self._inner.mix(tree, t)
        self.received.append(next(iter(out.values())).detach().clone())
        return out

    def push_sum(self, tree: Tree, weight: torch.Tensor, t: int) -> tuple[Tree, torch.Tensor]:
        (value,) = tree.values()
        self.sent.append(value.detach().clone())
        out, w = self._inner.push_sum(tree, weight, t)
        self.received.append(next(iter(out.values())).detach().clone())
        return out, w

    def take(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        sent, received = self.sent, self.received
        self.sent, self.received = [], []
        return sent, received

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def canary_views(
    run: Any, view: GossipView, *, world: np.ndarray, signs: np.ndarray, seed: int
) -> np.ndarray:
    """One batch of trials: ``(len(world), features)`` views of the adversary over the run's
    steps, ``world[k] = +-1`` the canary's sign in trial ``k``, keys from ``seed``."""
    if not isinstance(run.algorithm, Decor | Porter):
        raise ConfigError(f"{run.cfg.algorithm} is not audited by gossip views")
    alg: Any = run.algorithm  # Decor or Porter (one protocol: init / step)
    n = int(run.topology.n)
    dtype = torch.float64 if run.cfg.dtype == "float64" else torch.float32
    clip = alg.clip.threshold
    if clip is None:
        raise ConfigError(f"{run.cfg.algorithm} has no clipping threshold: nothing bounds a canary")
    oracle = _CanaryOracle(n, view.canary, float(clip), signs, torch.as_tensor(world))
    params = {"w": torch.zeros((n, len(world)), dtype=dtype)}
    views, _ = observe(run, view, oracle, params, keys=Keys.from_seed(seed))
    return views


def observe(
    run: Any, view: GossipView, oracle: Any, params: Tree, *, keys: Keys
) -> tuple[np.ndarray, Any]:
    """The run's own ``init`` and ``steps`` on ``params`` with ``oracle`` (a canary oracle, or
    the task's own data path for input canaries), through its communicator: what ``view``'s
    adversary sees, ``(size, features)`` (``size`` the coordinates of one node's model, one per
    trial), and the final state (its ``params`` are the trained models)."""
    alg: Any = run.algorithm  # Decor or Porter (one protocol: init / step)
    n, steps = int(run.topology.n), int(run.cfg.steps)
    first = next(iter(params.values()))
    size = sum(int(v[0].numel()) for v in params.values())
    if size * steps * view.features_per_step() > MAX_CELLS:
        raise ConfigError(
            f"{size} trials x {steps} steps x {view.features_per_step()} observed values is "
            "too large for one audit: use fewer trials or steps"
        )
    comm = _Recording(run.comm)
    state = alg.init(params, oracle, cast(Communicator, comm), keys=keys)
    edges = as_edge_array(alg.edges, n) if view.secret_edges else None
    rows = list(view.message_rows)
    parts: list[torch.Tensor] = []
    for t in range(steps):  # the run's own steps (each vectorised over all trials)
        state, _ = alg.step(state, oracle, cast(Communicator, comm))
        sent, received = comm.take()
        if view.released:
            parts.append(received[-1][:1].reshape(1, -1))
            continue
        if rows:
            parts.extend(message[rows].reshape(len(rows), -1) for message in sent)
        for e, row in view.secret_edges:  # the colluders' own edge noise v_{row, j}(t)
            assert edges is not None
            parts.append(
                correlated_noise(
                    [state.edge_keys[e]],
                    edges[e : e + 1],
                    n,
                    t,
                    size,
                    sigma_cor=float(alg.sigma_cor),
                    dtype=first.dtype,
                    nodes=[row],
                    backend=alg.noise_backend,
                )
            )
    if not parts:  # nothing observed on the way (a black-box adversary: the final models)
        return np.zeros((size, 0)), state
    return torch.cat(parts).T.to(torch.float64).numpy(), state


def public_signs(steps: int, seed: int) -> np.ndarray:
    """The canary's public sign pattern ``s_t`` (so a test can use differences across steps)."""
    return np.where(np.random.default_rng([seed, 0x5165]).random(steps) < 0.5, -1.0, 1.0)


def batches(trials: int, batch: int) -> list[int]:
    """Sizes of the batches of ``trials`` (each at most ``batch``; they differ by at most one)."""
    count = max(1, math.ceil(trials / batch))
    base = [trials // count] * count
    for k in range(trials - sum(base)):
        base[k] += 1
    return base
