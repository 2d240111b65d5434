"""The algorithm protocol every privdl algorithm follows, and the pieces they share.

An algorithm is a frozen description of one method (its step sizes, clipping, noise levels) with
two pure-ish functions (DESIGN.md, "Algorithm"; optax's ``init``/``update``)::

    state = algorithm.init(params, oracle, comm, keys=keys)
    state, info = algorithm.step(state, oracle, comm)

* ``params``: the initial models of the nodes this process owns, node-stacked (``(k, ...)``
  leaves, rows in the order of ``comm.owned``);
* ``oracle``: the task's view of the owned nodes' data (gradients at step ``t``; PrivSGP's table
  entries; the clients' local data) — the algorithm owns no data;
* ``comm``: the only way to talk to other nodes (:class:`~privdl.comm.base.Communicator`); an
  algorithm never asks which communicator it has;
* ``keys``: where every random draw comes from (:class:`Keys`), so a run is a function of its
  seed (a simulation) or of OS secrets (a deployment), and a resumed run draws what it would have.

The state is an explicit dataclass holding the step counter ``t`` and the models ``params`` (the
owned rows; a server's model as one row); everything else it holds is checkpointed by the loop.
No algorithm calibrates noise or accounts privacy: its recipe does (:mod:`privdl.recipes`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import torch

from privdl.comm.base import Communicator
from privdl.errors import ConfigError
from privdl.mechanisms._pool import beside_compute, spare_cpus
from privdl.mechanisms.identity import Authenticator
from privdl.mechanisms.secrets import agree_edge_secrets, node_noise_keys
from privdl.optim import OptState
from privdl.tree import Tree, consensus_distance, sq_norm_per_node, tree_map

__all__ = [
    "Algorithm",
    "AlgorithmState",
    "GradientOracle",
    "Keys",
    "StepInfo",
    "StepSize",
    "consensus_distance",
    "drawn_ahead",
    "finish_drawn_ahead",
    "in_background",
    "tree_map",
    "tree_sq_norm_per_node",
]

T = TypeVar("T")
S = TypeVar("S", bound="AlgorithmState")
_POOL: tuple[int, ThreadPoolExecutor] | None = None

#: What a step reports besides the new state (``loss`` per node at least; the recipes read
#: family-specific entries, e.g. a server's aggregation ``weights``).
StepInfo = dict[str, Any]

tree_sq_norm_per_node = sq_norm_per_node


@runtime_checkable
class AlgorithmState(Protocol):
    """What the loop reads of any algorithm's state: the step counter and the owned models."""

    t: int

    @property
    def params(self) -> Tree: ...


@runtime_checkable
class Algorithm(Protocol[S]):
    """The one protocol of privdl's algorithms (module docstring)."""

    def init(self, params: Tree, oracle: Any, comm: Communicator, *, keys: Keys) -> S: ...

    def step(self, state: S, oracle: Any, comm: Communicator) -> tuple[S, StepInfo]: ...


def _os_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class Keys:
    """Where an algorithm's randomness comes from: explicit, as a PRNG key in optax.

    Three kinds of randomness, kept apart because only two of them must be secret:

    * ``seed`` — public randomness: initial models, compression masks, random matchings;
    * the **stream keys** of the privacy noise (each node's key, DECOR's per-edge secrets from
      X25519 + HKDF; :mod:`privdl.mechanisms.secrets`);
    * ``sampling_seed`` — which examples a minibatch draws (subsampling amplification assumes
      the adversary does not know it).

    ``source="seed"``: the keys are derived from ``seed`` and ``sampling_seed = seed`` (a
    reproducible simulation: whoever knows the seed can rebuild the noise, as Opacus without
    ``secure_mode``). ``source="os"``: keys and sampling seed from the operating system; the loop
    keeps them with the checkpoint (one process) or in each rank's key file (several).
    """

    seed: int = 0
    source: Literal["seed", "os"] = "seed"
    sampling_seed: int = 0
    session_id: str = ""
    #: signs and verifies DECOR's X25519 keys against a roster (docs/security.md s.3)
    authenticator: Authenticator | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_seed(cls, seed: int, *, session_id: str = "") -> Keys:
        """Everything derived from ``seed`` (a reproducible simulation)."""
        return cls(int(seed), "seed", int(seed), session_id)

    @classmethod
    def from_os(cls, seed: int, *, sampling_seed: int | None = None) -> Keys:
        """Stream keys and (unless given) the sampling seed from OS randomness; ``seed`` still
        draws the public randomness."""
        return cls(int(seed), "os", _os_seed() if sampling_seed is None else int(sampling_seed))

    @property
    def secret_seed(self) -> int | None:
        """The seed the stream keys derive from (None: OS randomness)."""
        return self.seed if self.source == "seed" else None

    def node_noise_keys(self, nodes: Iterable[int]) -> tuple[bytes, ...]:
        """One private 32-byte stream key per node in ``nodes`` (global ids), in that order."""
        return tuple(node_noise_keys(nodes, seed=self.secret_seed, session_id=self.session_id))

    def edge_keys(self, edges: Any, n_nodes: int, comm: Communicator) -> tuple[bytes | None, ...]:
        """DECOR's per-edge secrets for the edges incident to the owned nodes (None elsewhere),
        agreed by X25519 over ``comm.key_transport`` (only public keys cross it; signed and
        verified against the roster with an ``authenticator``)."""
        auth = self.authenticator
        secrets = agree_edge_secrets(
            edges,
            n_nodes,
            transport=comm.key_transport(edges, record_bytes=32 if auth is None else 96),
            nodes=comm.owned_list,
            seed=self.secret_seed,
            session_id=self.session_id,
            authenticator=auth,
        )
        return tuple(secrets.edge_keys())


def in_background(fn: Callable[[], T], *, device: torch.device) -> Callable[[], T]:
    """Start ``fn()`` now; return a getter for its result (exceptions re-raised there).

    For the noise of a step, which depends only on the stream keys and t, not on the gradients:
    on a CPU it is drawn in a worker thread while the caller computes the gradients, so the step
    costs about max(noise, gradients) instead of their sum; the values are the same as an inline
    call. On other devices ``fn`` runs inline (their kernels are asynchronous already), and on a
    CPU whose every usable core runs one of torch's intra-op threads (:func:`spare_cpus` is 0):
    there a worker thread only preempts them, and inline its kernels take every core. Measured
    on 2 cores with torch at 2 threads (2026-11-28, consecutive steps): the DP-SGD MLP step
    (batch 64) 1.99x the plain torch step inline against 2.34x drawn ahead in a worker.
    """
    global _POOL
    if torch.device(device).type != "cpu" or not spare_cpus():
        try:
            value = fn()
        except Exception as error:  # re-raised by the getter, as from the worker
            failed = error

            def reraise() -> T:
                raise failed

            return reraise
        return lambda: value
    if _POOL is None or _POOL[0] != os.getpid():  # one worker per process (forks start afresh)
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="privdl-noise"))
    return _POOL[1].submit(beside_compute(fn)).result  # its kernels leave torch's threads alone


#: Draws started one step ahead (:func:`drawn_ahead`): owner tuple, the step it is for, getter.
_AHEAD: list[tuple[tuple[Any, ...], int, Callable[[], Any]]] = []
_AHEAD_OWNERS = 4  # a few runs side by side in one process (e.g. a benchmark's or a sweep's)


def drawn_ahead(
    owner: tuple[Any, ...],
    t: int,
    draw: Callable[[int], T],
    *,
    device: torch.device,
    ahead: bool = True,
) -> Callable[[], T]:
    """A getter for ``draw(t)``, and ``draw(t + 1)`` started in the background behind it.

    For noise that is a pure function of the step and of keys fixed for the run (DECOR's line 3):
    on a CPU, step t's draw is served from the one the previous call of the same ``owner`` started
    when it took step t - 1's, so the worker thread draws during the whole previous step (its
    tail: gossip and update, then this step's gradients) instead of during the gradients only.
    ``owner`` names the run by object identity (e.g. the algorithm and its state's key tuples:
    a resumed run has new ones and starts afresh); the values are ``draw(t)``'s whatever is
    served (one worker runs the draws in order). Another ``t`` (a rerun step) or owner draws
    anew. On other devices ``draw(t)`` runs inline, as :func:`in_background` does.
    ``ahead=False`` is :func:`in_background` of ``draw(t)`` alone (``Decor(draw_ahead=False)``).
    """
    if not ahead or torch.device(device).type != "cpu" or not spare_cpus():
        return in_background(lambda: draw(t), device=device)
    pending = None
    for k, (who, step, getter) in enumerate(_AHEAD):
        if len(who) == len(owner) and all(a is b for a, b in zip(who, owner, strict=True)):
            del _AHEAD[k]
            if step == t:
                pending = getter
            break
    if pending is None:
        pending = in_background(lambda: draw(t), device=device)
    _AHEAD.append((owner, t + 1, in_background(lambda: draw(t + 1), device=device)))
    if len(_AHEAD) > _AHEAD_OWNERS:
        del _AHEAD[0]
    return pending


def finish_drawn_ahead(*, keep: bool = False, wait: bool = True) -> None:
    """Wait for the draws :func:`drawn_ahead` started and drop them (their memory too once
    drawn) for the end of a run (``wait=False``: drop them at once, their errors unseen);
    ``keep=True`` keeps them for the steps they are for (a benchmark timing a block of steps
    with the draw its last step started, which the next block then uses)."""
    pending = list(_AHEAD)
    if not keep:
        _AHEAD.clear()
    for _, _, getter in pending if wait else ():
        getter()


@dataclass(frozen=True)
class StepSize:
    """Step size ``eta_t = lr / (1 + t / decay)`` (``decay=None``: constant ``lr``).

    The DECOR reference code decays ``lr0/(1 + t/5000)`` in its NN and a9a runs without saying so
    in the paper (DECOR Section 6 and its code); here the schedule is always explicit.
    """

    lr: float
    decay: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"learning rate must be a positive number, got {self.lr}")
        if self.decay is not None and not (math.isfinite(self.decay) and self.decay > 0):
            raise ConfigError(f"lr decay must be positive, got {self.decay}")

    def __call__(self, t: int) -> float:
        return self.lr if self.decay is None else self.lr / (1.0 + t / self.decay)


class GradientOracle(Protocol):
    """What a first-order algorithm asks of a task: clipped per-node gradients at step ``t``.

    The oracle samples its own minibatch for step ``t`` from a generator keyed by
    ``(sampling seed, t)`` (so a resumed run sees the same batches) for the nodes it holds, and
    applies the clipping the algorithm asks for.
    """

    def __call__(self, params: Tree, t: int, *, clip: Any) -> Any:  # -> engine.GradResult
        ...


def optimizer_buffers(optimizer: Any, params: Tree) -> dict[str, torch.Tensor]:
    """A fresh optimizer state of every held node, flat (``"momentum/<leaf>"``), for a state
    dataclass field (checkpointed with the other node-stacked tensors); {} for plain SGD."""
    if optimizer is None:
        return {}
    return _flat(optimizer.init(params).buffers)


def optimizer_step(
    optimizer: Any,
    update: Tree,
    buffers: dict[str, torch.Tensor],
    params: Tree,
    *,
    t: int,
    lr: float,
) -> tuple[Tree, dict[str, torch.Tensor]]:
    """``params + delta`` of ``optimizer`` (its state: ``buffers`` after ``t`` updates) applied
    to the privatized ``update`` (:mod:`privdl.optim`), and the new buffers."""
    nested: dict[str, Tree] = {}
    for key, v in buffers.items():
        name, _, leaf = key.partition("/")
        nested.setdefault(name, {})[leaf] = v
    delta, new = optimizer.update(update, OptState(t, nested), params, lr=lr)
    return {k: params[k] + delta[k] for k in params}, _flat(new.buffers)


def _flat(buffers: Any) -> dict[str, torch.Tensor]:
    return {f"{name}/{leaf}": v for name, tree in buffers.items() for leaf, v in tree.items()}


def held_nodes(comm: Communicator, params: Tree) -> tuple[int, ...]:
    """The global ids of the rows of ``params`` (``comm.owned``), checked against its rows."""
    nodes = tuple(comm.owned_list)
    rows = next(iter(params.values())).shape[0]
    if rows != len(nodes):
        raise ConfigError(
            f"params have {rows} rows but the communicator owns {len(nodes)} nodes: pass "
            "comm.shard(params)"
        )
    return nodes
