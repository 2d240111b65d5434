"""Recipes: how to configure, calibrate, build and account one family of algorithms.

A recipe is what turns a validated configuration into a :class:`Run` (DESIGN.md, "Recipe and
registry"): its config model (a :class:`~privdl.config.CommonConfig` with the family's options),
the family's checks and defaults (:meth:`Recipe.resolve`), the calibration of noise to a target
epsilon, the construction of the algorithm and its oracle, and the privacy accountant of the run.
The registry (:mod:`privdl.registry`) maps algorithm names to recipe instances; an instance's
attributes say what distinguishes one algorithm of the family from another (e.g. the noise kind),
so nothing branches on algorithm names.

A :class:`Run` is the composed parts of one run on one process: the loop
(:mod:`privdl.loop`) initialises, steps, evaluates and checkpoints through it, whatever the
algorithm and whether the process owns every node or a shard of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from privdl.algorithms.base import Algorithm, Keys, StepInfo
from privdl.comm.base import Communicator
from privdl.config import CommonConfig
from privdl.errors import ConfigError, PrivdlError
from privdl.tasks import build_task
from privdl.tree import Tree, consensus_distance

__all__ = ["Recipe", "Run", "export_state", "import_state", "outsider_label", "seed_shared"]

#: State fields that are not saved: derived from the seed and the node ids on every start.
DERIVED = ("t", "seed", "noise_keys", "edge_keys", "nodes")
#: The state's stream keys: each node's own noise keys and DECOR's per-edge secrets.
KEY_FIELDS = ("noise_keys", "edge_keys")


class Recipe:
    """One family of algorithms (module docstring). Subclasses set :attr:`config_model` and
    override what their family does differently; the defaults fit a decentralized family whose
    state is a dataclass of node-stacked tensors."""

    #: The family's configuration model (the options a run of it takes).
    config_model: ClassVar[type[CommonConfig]] = CommonConfig
    #: How messages name the family ("the federated algorithms"); "" lists the names instead.
    family: ClassVar[str] = ""
    #: Whether every process draws every node's randomness from ONE generator (so the sampling
    #: seed of a multi-process run is rank 0's, broadcast).
    shared_sampling: ClassVar[bool] = False
    #: Whether the state is one model replicated on every process (a server's), not node rows.
    replicated: ClassVar[bool] = False
    #: ``clip_mode`` when ``clip`` is given without one, and ``clip_kind`` when unset.
    default_clip_mode: str = "per_sample"
    default_clip_kind: str = "hard"

    # -- configuration ----------------------------------------------------------------------
    def resolve(self, cfg: Any, given: Mapping[str, Any]) -> Any:
        """The family's checks and defaults on a validated ``cfg`` (``given``: the values the
        user gave, to tell a default from an explicit choice). Returns the resolved config."""
        return cfg

    def foreign(self, key: str, algorithm: str, owners: str) -> str:
        """The message for ``key``, an option of other algorithms (``owners``) given here."""
        return f"{key} applies to {owners}, not {algorithm!r}"

    def prepare(self, cfg: Any) -> Any:
        """Values fixed when a run starts (e.g. the noise backend for the device); saved."""
        return cfg

    # -- construction -----------------------------------------------------------------------
    def n_nodes(self, cfg: Any) -> int:
        """How many nodes (or clients) the run has."""
        raise NotImplementedError

    def topology(self, cfg: Any) -> tuple[Any, Any]:
        """``(topology, schedule)``: the graph facts the records keep and what the
        communicator mixes with (a mixing matrix, a time-varying graph, or none)."""
        raise NotImplementedError

    def make_task(self, cfg: Any, n_nodes: int, *, user: Any = None) -> Any:
        """The task (data split over the nodes, model, loss); ``user``: objects from Python."""
        return build_task(cfg, n_nodes=n_nodes, user=user)

    def calibrate(self, cfg: Any, topology: Any, task: Any) -> Any:
        """``cfg`` with its noise set for its target epsilon (unchanged without a target)."""
        return cfg

    def algorithm(self, cfg: Any, topology: Any, task: Any) -> Algorithm[Any]:
        """The algorithm object of a calibrated ``cfg``."""
        raise NotImplementedError

    def oracle(self, cfg: Any, task: Any, algorithm: Any, nodes: list[int]) -> Any:
        """What the algorithm asks of the task, for the nodes ``nodes`` of this process."""
        return task.oracle_for(nodes)

    def initial_params(self, cfg: Any, task: Any) -> Tree:
        """``x^0`` of every node (the full ``(n, ...)`` tree)."""
        params: Tree = task.init_params(seed=cfg.seed)
        return params

    # -- privacy ----------------------------------------------------------------------------
    #: How the records name a party of this family ("node", "client").
    party: ClassVar[str] = "node"

    def noise_rebuild(self, run: Run) -> dict[str, str]:
        """Who could rebuild each party's noise from what they hold (docs/security.md s.1): a
        run's records say it next to the threat model. Keys from the seed: whoever knows the
        seed; ``key_source = "os"`` in one process: that process (its checkpoint keeps the
        keys); under ``privdl launch``: only the rank that owns the party, and for DECOR's
        pairwise noise the ranks of both ends (each keeps its edge secrets)."""
        party = self.party
        if run.cfg.key_source != "os":
            if seed_shared(run):
                return {
                    f"every {party}'s noise": "whoever knows the seed: every rank of the "
                    "launched run, rank 0 (the writer of the records"
                    + (", and the server)" if self.replicated else ")")
                    + " among them"
                }
            return {f"every {party}'s noise": "whoever knows the seed"}
        if run.comm.world_size == 1:
            return {
                f"every {party}'s noise": "this process, and whoever reads its checkpoint.pt "
                "(it keeps the keys)"
            }
        out = {f"independent noise of {party} i": f"only the rank that owns {party} i"}
        if getattr(run.algorithm, "sigma_cor", 0) > 0:
            out["correlated noise of edge (i, j)"] = "the ranks that own i and j"
        return out

    def accountant(
        self, cfg: Any, topology: Any, task: Any, algorithm: Any
    ) -> Callable[[int], dict[str, Any] | None] | None:
        """``t -> labelled (epsilon, delta)`` after t steps, or None for a non-private run."""
        return None

    def calibration_record(self, run: Run) -> dict[str, Any] | None:
        """The accounted noise beside a paper's formula (labelled nominal), or None."""
        return None

    # -- the loop's steps -------------------------------------------------------------------
    def advance(self, run: Run, state: Any) -> tuple[Any, StepInfo]:
        """One step of the algorithm."""
        new, info = run.algorithm.step(state, run.oracle, run.comm)
        return new, info

    def gather(self, run: Run, state: Any) -> tuple[Tree, dict[str, torch.Tensor]]:
        """Every node's models and state tensors on every process (collective): what the
        evaluation reads and the checkpoint keeps."""
        return (
            run.comm.all_gather_nodes(state.params),
            run.comm.all_gather_nodes(export_state(state)),
        )

    def metrics(self, run: Run, state: Any, params: Tree) -> dict[str, Any]:
        """The task's metrics of the averaged model and the nodes' consensus distance."""
        row = dict(run.task.evaluate(params))
        row["consensus_distance"] = consensus_distance(params)
        return row

    def checkpoint(
        self, run: Run, state: Any, params: Tree, tensors: dict[str, Any]
    ) -> dict[str, Any]:
        """A checkpoint: the models, the step and the full state on the CPU."""
        ckpt: dict[str, Any] = {"params": {k: v.cpu() for k, v in params.items()}, "t": state.t}
        if tensors:
            ckpt["state"] = {k: v.cpu() for k, v in tensors.items()}
        return ckpt

    def shard_checkpoint(self, run: Run, state: Any) -> dict[str, Any]:
        """This process's own rows of the checkpoint, on the CPU: what each rank of a launched
        run keeps in its own file (nothing of another rank's nodes: their SAGA tables hold
        un-noised gradients of their data, docs/security.md s.1)."""
        tensors = export_state(state)
        ckpt: dict[str, Any] = {
            "params": {k: v.detach().cpu() for k, v in state.params.items()},
            "t": state.t,
            "owned": run.comm.owned_list,
        }
        if tensors:
            ckpt["state"] = {k: v.detach().cpu() for k, v in tensors.items()}
        return ckpt

    def restore_shard(self, run: Run, state: Any, ckpt: dict[str, Any]) -> Any:
        """``state`` (a fresh ``init``) with this process's own checkpoint put back."""
        params = {k: v.to(run.device) for k, v in ckpt["params"].items()}
        return import_state(state, params, ckpt.get("state") or {}, t=int(ckpt["t"]))

    def restore(self, run: Run, state: Any, ckpt: dict[str, Any]) -> Any:
        """``state`` (a fresh ``init``) with the checkpoint's rows of this process put back."""
        full = {k: v.to(run.device) for k, v in ckpt["params"].items()}
        saved = run.comm.shard(ckpt["state"]) if ckpt.get("state") else {}
        return import_state(state, run.comm.shard(full), saved, t=int(ckpt["t"]))


@dataclass
class Run:
    """The composed parts of one run on one process (module docstring)."""

    cfg: Any
    recipe: Recipe
    topology: Any
    comm: Communicator
    task: Any
    algorithm: Any
    oracle: Any
    privacy: Callable[[int], dict[str, Any] | None] | None
    keys: Keys
    #: what the recipe keeps between steps for its records (e.g. a server's last weights)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return torch.device(self.cfg.device)

    @property
    def sharded(self) -> bool:
        """Whether each process checkpoints its own nodes' rows (several processes owning node
        rows); a server's model (``replicated``) is rank 0's to checkpoint."""
        return self.comm.world_size > 1 and not self.recipe.replicated

    def init_state(self) -> Any:
        """``algorithm.init`` on this process's rows of ``x^0`` (a server's model: all of it)."""
        params = self.recipe.initial_params(self.cfg, self.task)
        if not self.recipe.replicated:
            params = self.comm.shard(params)
        return self.algorithm.init(params, self.oracle, self.comm, keys=self.keys)

    def advance(self, state: Any) -> Any:
        """One step; what the step reported is kept in ``last_info``."""
        state, info = self.recipe.advance(self, state)
        self.notes["last_info"] = info
        return state

    def evaluate(
        self, state: Any, wall: float
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The metrics row and the checkpoint at ``state.t`` (every process gathers the models;
        the writer, rank 0, gets the row, the others None). A :attr:`sharded` run's checkpoint
        is every process's own rows; otherwise the writer's holds every node's (None elsewhere)."""
        tensors: dict[str, torch.Tensor] = {}
        ckpt: dict[str, Any] | None = None
        if self.sharded:  # the models for the metrics; the state stays with its rank
            params = self.comm.all_gather_nodes(state.params)
            ckpt = {**self.recipe.shard_checkpoint(self, state), "wall_time": wall}
        else:
            params, tensors = self.recipe.gather(self, state)
        if not self.comm.is_writer:
            return None, ckpt
        row: dict[str, Any] = {"step": state.t, "wall_time": round(wall, 4)}
        row.update(self.recipe.metrics(self, state, params))
        priv = self.privacy(state.t) if self.privacy is not None else None
        if priv is not None:
            row["privacy"] = priv
        if isinstance(row.get("privacy"), dict):  # who could rebuild the noise, per party
            spent = row["privacy"]
            if seed_shared(self):  # and the label follows: not against whoever can
                spent = outsider_label(spent, self)
            row["privacy"] = {**spent, "rebuild": self.recipe.noise_rebuild(self)}
        if ckpt is None:
            ckpt = self.recipe.checkpoint(self, state, params, tensors)
            ckpt["wall_time"] = wall
        return row, ckpt

    def calibration(self) -> dict[str, Any] | None:
        record = self.recipe.calibration_record(self)
        return outsider_label(record, self) if record and seed_shared(self) else record

    def accounted_record(self, delta: float) -> dict[str, Any]:
        """The start of a calibration record: the target, its delta, and the calibrated sigma
        with what the run's accountant certifies for it after all its steps."""
        priv = (self.privacy(self.cfg.steps) if self.privacy is not None else None) or {}
        return {
            "target_epsilon": self.cfg.epsilon,
            "delta": delta,
            "accounted": {"sigma": self.cfg.sigma, **priv},
        }


#: Threat models whose adversary is an outsider of the run (no party's secrets): they stay
#: honest when every party knows the seed. Every other (a server, curious nodes, colluders, the
#: receivers of LDP messages) is an insider of a launched run, where every rank has the seed.
OUTSIDER_THREATS = ("eavesdropper", "central")
#: The note of a launched run with keys from the seed (docs/security.md s.1).
SEED_SHARED_NOTE = (
    "launched with keys from the seed, which every rank knows (rank 0{server} among them): "
    "any rank can rebuild every {party}'s noise, so this epsilon is certified only against an "
    "eavesdropper who sees every message and does not know the seed, not against {insider} "
    "(--key-source os keeps each {party}'s keys with the rank that owns it)"
)


def seed_shared(run: Run) -> bool:
    """Whether insiders of ``run`` know the seed its keys come from: a ``key_source = "seed"``
    run on several processes (every rank holds the seed), or resumed from one that was. One
    process with the seed is a simulation (its notes say who can rebuild the noise)."""
    if run.notes.get("seed_shared"):  # its earlier steps were (a resumed run's checkpoint)
        return True
    return run.cfg.key_source != "os" and run.comm.world_size > 1


def outsider_label(record: Any, run: Run) -> Any:
    """``record`` (a privacy record, or a record holding some) with every threat model of an
    insider (any not in :data:`OUTSIDER_THREATS`) replaced by ``eavesdropper`` and a note saying
    why: in a launched run with seeded keys the server (or any node's rank) can rebuild the
    noise, so its epsilon does not hold against it. The numbers stay: an insider's epsilon
    bounds an eavesdropper too, whose view is the insider's less its secrets (DECOR's SecRDP:
    the colluders' view is the eavesdropper's plus their edge secrets, docs/accounting.md s.1;
    the server's view is the updates an eavesdropper on its links sees)."""
    if isinstance(record, list):
        return [outsider_label(v, run) for v in record]
    if not isinstance(record, dict):
        return record
    out = {k: outsider_label(v, run) for k, v in record.items()}
    threat = out.get("threat_model")
    if isinstance(threat, str) and threat not in OUTSIDER_THREATS:
        server = run.recipe.replicated
        note = SEED_SHARED_NOTE.format(
            server=", the server" if server else "",
            party=run.recipe.party,
            insider="the server" if server else f"the {threat} threat model's adversary",
        )
        out["threat_model"] = "eavesdropper"
        out["notes"] = "; ".join(x for x in (out.get("notes"), note) if x)
    return out


def export_state(state: Any) -> dict[str, torch.Tensor]:
    """The algorithm state's node-leading tensors as one flat tree (``name`` or ``name/leaf``).

    Everything but the step and the seed-derived keys: PORTER's surrogates ``q_x, q_v``, tracker
    ``v`` and stored noisy gradient ``g_prev``; PrivSGP's ``x, w``, SAGA table and running mean.
    The compressor and sampling generators are keyed by ``(seed, t)``: ``t`` is their position.
    """
    out: dict[str, torch.Tensor] = {}
    for f in dataclasses.fields(state):
        v = getattr(state, f.name)
        if f.name in DERIVED or f.name == "params" or v is None:
            continue
        if isinstance(v, torch.Tensor):
            out[f.name] = v
        elif isinstance(v, dict):
            out.update({f"{f.name}/{k}": leaf for k, leaf in v.items()})
    return out


def import_state(state: Any, params: Tree, saved: Mapping[str, torch.Tensor], *, t: int) -> Any:
    """``state`` (a fresh ``init``) with the saved tensors, parameters and step put back."""
    names = {f.name for f in dataclasses.fields(state)}
    dev = next(iter(params.values())).device
    updates: dict[str, Any] = {}
    if "params" in names:
        updates["params"] = {k: v.to(dev) for k, v in params.items()}
    for key, v in saved.items():
        name, _, leaf = key.partition("/")
        if name not in names:
            raise PrivdlError(f"the checkpoint does not match the algorithm (field {name!r})")
        if leaf:
            updates.setdefault(name, {})[leaf] = v.to(dev)
        else:
            updates[name] = v.to(dev)
    new = dataclasses.replace(state, **updates)
    new.t = int(t)
    return new


def refuse_non_private(cfg: Any, given: Mapping[str, Any], *, private_names: str) -> None:
    """A non-private algorithm given a privacy target is an error, named."""
    targets = [k for k in ("epsilon", "delta") if given.get(k) is not None]
    if targets:
        raise ConfigError(
            f"{cfg.algorithm} is non-private: drop {' and '.join(targets)} ({private_names} "
            "take a privacy target)"
        )


def resolve_common(recipe: Recipe, cfg: Any, given: Mapping[str, Any]) -> Any:
    """The checks and defaults every family shares (clipping, task options, the target)."""
    fields = type(cfg).model_fields
    default = {k: f.default for k, f in fields.items()}
    if cfg.clip_mode != "none" and cfg.clip is None:
        raise ConfigError(f"clip_mode={cfg.clip_mode!r} needs a clipping threshold (--clip C)")
    if cfg.clip is not None and given.get("clip_mode") == "none":
        raise ConfigError(f"clip_mode='none' contradicts clip={cfg.clip}: drop one of them")
    updates: dict[str, Any] = {}
    if cfg.clip is not None and cfg.clip_mode == "none":
        updates["clip_mode"] = recipe.default_clip_mode
    if cfg.clip_kind is None:
        updates["clip_kind"] = recipe.default_clip_kind
    if cfg.task != "least-squares" and cfg.ls_dim != default["ls_dim"]:
        raise ConfigError(f"ls_dim is least-squares' dimension; task {cfg.task} has its own data")
    ignored = [
        k
        for k in ("model", "partition", "sampling", "batch_size")
        if k in given and given[k] != default[k]
    ]
    if cfg.task == "least-squares" and ignored:
        raise ConfigError(
            "least-squares has its own linear model and per-node data, and every node takes its "
            f"full local gradient (DECOR §6.1): drop {', '.join(ignored)}, or pick a supervised "
            "task (a9a, mnist, fashion-mnist, cifar10, synthetic-cifar10)"
        )
    if cfg.delta is not None and not 0.0 < cfg.delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {cfg.delta}")
    if cfg.epsilon is not None and not (math.isfinite(cfg.epsilon) and cfg.epsilon > 0):
        raise ConfigError(f"epsilon must be positive, got {cfg.epsilon}")
    return cfg.model_copy(update=updates) if updates else cfg
