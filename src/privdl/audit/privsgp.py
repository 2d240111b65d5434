"""White-box audits of PrivSGP-VR (Zhu et al., IJCAI 2024, Algorithm 1) as implemented.

The run is built by its recipe (noise calibrated to the target as ``privdl run`` does: K Gaussian
steps of sensitivity ``(4 - 2/J) C``, no subsampling amplification, because the SAGA mean depends
on every sample); its own ``init`` (the table's full pass) and ``step`` (lines 1-8: a random entry
``xi``, ``g = h - T[xi] + mean``, noise, push-sum) run on a *canary sample oracle*: entry ``j*`` of
node 0 is the canary sample, whose gradient is ``w s_t C`` at step ``t`` (``s_t = +-1`` a public
pattern, ``w = -1`` or ``+1`` the two neighbouring datasets, replace-one of one sample), every
other entry is zero. A sign that changes over time is what lets ``h - T[xi]`` reach ``2C`` per
world (the ``4C`` of the sensitivity); the sampled ``xi`` stay secret. A batch of trials is one
run. PrivSGP (Algorithm 2, accounted with the amplification of the secret 1/J draw): each trial
is its own copy of the network, so the algorithm's sampler draws each trial's ``xi``.
PrivSGP-VR (accounted for every sequence of draws): each trial is one coordinate of one network,
sharing the draws (docs/auditing.md). The adversary sees node 0's messages (its push-sum
half-steps), every step.

Input canaries (:func:`privsgp_input_views`): a canary *example* in node 0's data instead,
through the run's own sample oracle (the task's model, per-sample clipping, block means), one
network copy per trial for both algorithms; node 0's messages or, black box, the final models.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from privdl.algorithms.base import Keys
from privdl.audit.gossip import MAX_CELLS, _Recording
from privdl.comm.base import Communicator
from privdl.errors import ConfigError
from privdl.tree import Tree

__all__ = [
    "INPUT_ENTRIES",
    "CanarySamples",
    "build_privsgp_input_run",
    "privsgp_input_views",
    "privsgp_views",
]

#: The canary's entry in node 0's table.
CANARY_ENTRY = 0


class CanarySamples:
    """A PrivSGP sample oracle (:class:`privdl.algorithms.privsgp.SampleOracle`) over ``copies``
    disjoint copies of the ``n``-node network (node ``b n + i`` is node ``i`` of copy ``b``), each
    with ``world.numel() / copies`` coordinates (trials). Its only non-zero entries are node 0's
    canaries, ``world * s_t * C`` at step ``t``, present in a step only where that copy's node 0
    drew the canary's entry ``xi``."""

    def __init__(
        self,
        n_nodes: int,
        n_entries: int,
        clip: float,
        signs: np.ndarray,
        world: Tensor,
        *,
        copies: int = 1,
    ) -> None:
        self.copies, self.nodes_per_copy = copies, n_nodes
        self.n_nodes, self.n_entries = n_nodes * copies, n_entries
        self.world = world.reshape(copies, -1)
        self.entry_size = self.dim = int(self.world.shape[1])
        self.clip, self.signs = clip, signs
        self.step = 0  # entries() is called once per step, in order

    def _canary(self, t: int, dtype: torch.dtype) -> Tensor:
        return self.world.to(dtype) * float(self.signs[min(t, len(self.signs) - 1)] * self.clip)

    def entries(self, params: Tree, index: Tensor) -> tuple[Tensor, Tensor]:
        x = next(iter(params.values()))
        out = torch.zeros((self.n_nodes, self.dim), dtype=x.dtype)
        drawn = index[:: self.nodes_per_copy] == CANARY_ENTRY  # each copy's own node-0 draw
        out[:: self.nodes_per_copy] = torch.where(
            drawn[:, None], self._canary(self.step, x.dtype), torch.zeros((), dtype=x.dtype)
        )
        self.step += 1
        return out, torch.zeros(self.n_nodes, dtype=x.dtype)

    def expand(self, entry: Tensor, index: Tensor) -> Tensor:
        return entry

    def all_entries(self, params: Tree) -> Tensor:
        x = next(iter(params.values()))
        table = torch.zeros((self.n_nodes, self.n_entries, self.dim), dtype=x.dtype)
        table[:: self.nodes_per_copy, CANARY_ENTRY] = self._canary(0, x.dtype)
        return table

    def table_mean(self, table: Tensor) -> Tensor:
        return table.mean(1)


class _Copies:
    """``copies`` disjoint copies of the run's network as one network of ``copies * n`` nodes
    (node ``b n + i`` is node ``i`` of copy ``b``): the algorithm draws its entries ``xi`` and its
    noise per node, so per copy. Push-sum runs on the run's own communicator with the copies as
    coordinates: the push-sum weights are data-free and the same in every copy."""

    def __init__(self, inner: Any, copies: int) -> None:
        self._inner, self.copies = inner, copies
        self.n_nodes = int(inner.n_nodes) * copies
        self.owned_list = list(range(self.n_nodes))

    def push_sum(self, tree: Tree, weight: Tensor, t: int) -> tuple[Tree, Tensor]:
        ((key, value),) = tree.items()
        n, b = int(self._inner.n_nodes), self.copies
        flat = value.reshape(b, n, -1)
        d = int(flat.shape[2])
        w = weight.reshape(b, n)
        if not bool((w == w[:1]).all()):
            raise AssertionError("push-sum weights differ between the audit's copies")
        mixed = flat.transpose(0, 1).reshape(n, b * d)
        out, w_new = self._inner.push_sum({key: mixed}, w[0], t)
        back = out[key].reshape(n, b, d).transpose(0, 1).reshape(value.shape)
        return {key: back}, w_new.repeat(b)


def privsgp_views(
    run: Any, *, world: np.ndarray, signs: np.ndarray, seed: int, own_draws: bool = True
) -> np.ndarray:
    """``(len(world), steps)``: node 0's messages in each trial, every step.

    ``own_draws`` (PrivSGP): every trial is its own copy of the network in one run
    (:class:`_Copies`), so it draws its own entries ``xi`` by the algorithm's own sampler, as
    the accountant's amplification by the 1/J draw assumes (one draw shared by a batch of trials
    would condition the amplification away and make the trials dependent). Otherwise
    (PrivSGP-VR, accounted without amplification, for every sequence of draws) the trials are
    coordinates of one network: they share the draws and are independent given them.
    """
    from privdl.recipes.privsgp import privsgp_geometry

    n, steps, size = int(run.comm.n_nodes), int(run.cfg.steps), len(world)
    if size * steps > MAX_CELLS:
        raise ConfigError(f"{size} trials x {steps} steps is too large for one audit")
    entries, _ = privsgp_geometry(run.cfg, run.task)
    copies = size if own_draws else 1
    oracle = CanarySamples(n, int(entries), float(run.cfg.clip), signs, torch.as_tensor(world),
                           copies=copies)  # fmt: skip
    rec = _Recording(run.comm)
    comm = _Copies(rec, copies)
    dtype = torch.float64 if run.cfg.dtype == "float64" else torch.float32
    params = {"x": torch.zeros((n * copies, size // copies), dtype=dtype)}
    keys = Keys.from_seed(seed)
    state = run.algorithm.init(params, oracle, cast(Communicator, comm), keys=keys)
    parts = []
    for _ in range(steps):
        state, _ = run.algorithm.step(state, oracle, cast(Communicator, comm))
        sent, _ = rec.take()
        parts.append(sent[-1][0])  # node 0's message, copy after copy (or trial after trial)
    return torch.stack(parts).T.to(torch.float64).numpy()


# --------------------------------------------------------------------------- input canaries
#: Table entries (blocks) of every node in an input-canary audit: ``J``.
INPUT_ENTRIES = 4


def build_privsgp_input_run(values: dict[str, Any], *, entries: int = INPUT_ENTRIES) -> Any:
    """The PrivSGP(-VR) run of an input-canary audit, built as ``privdl.train`` builds a run on
    the caller's data and model (``task="user"``; noise calibrated to ``values``' epsilon by the
    recipe): every node holds ``entries`` blocks of ``block_size`` one-feature examples (label
    1; at least the task's batch size of them, so more blocks where ``block_size`` is small), all zero but node 0's first example, the canary's slot (:func:`privsgp_input_views`
    writes each trial's canary there); the model is a bias-free linear layer ``f(x) = w x``
    (logistic loss) started at ``w = 0``."""
    from torch import nn

    from privdl.audit.examples import CANARY_SCALE
    from privdl.data.custom import user_data
    from privdl.loop import build_run  # the loop imports the registry, which imports recipes
    from privdl.registry import make_config
    from privdl.tasks import UserObjects
    from privdl.topology import parse_topology

    cfg: Any = make_config({**values, "task": "user"})
    # the task checks its (unused) minibatch size against the data: at least that many rows
    rows = max(int(entries) * int(cfg.block_size), int(cfg.batch_size))
    clip = float(cfg.clip or 1.0)
    nodes = parse_topology(str(cfg.graph)).n
    zero = (torch.zeros((rows, 1)), torch.ones(rows, dtype=torch.int64))
    x0 = torch.zeros((rows, 1))
    x0[CANARY_ENTRY * int(cfg.block_size), 0] = CANARY_SCALE * clip
    data = [(x0, zero[1]), *([zero] * (nodes - 1))]
    model = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(model.weight)
    return build_run(cfg, user=UserObjects(data=user_data(data, n_classes=2), model=model))


def privsgp_input_views(
    run: Any, *, world: np.ndarray, seed: int, black_box: bool = False
) -> np.ndarray:
    """Input canaries (black box as to the gradients): each trial is its own copy of the run's
    network (:class:`_Copies`: its own entries ``xi``, its own noise) running the run's own
    sample oracle (:class:`privdl.algorithms.privsgp.ModelSamples`: the task's model, per-sample
    clipping) on the run's data, node 0's canary example ``world Y`` (label 1, ``Y = 100 C``:
    its logistic gradient ``-world Y / 2`` at ``w = 0`` is clipped to ``-world C``, the two
    worlds a replace-one pair ``2C`` apart). The view: ``(len(world), steps)`` node 0's
    messages (its push-sum half-steps), every step, or (``black_box``) ``(len(world), n)`` the
    loss of the ``+Y`` canary on every node's final model ``z_i = x_i / w_i``."""
    from dataclasses import replace

    from privdl.audit.examples import CANARY_SCALE
    from privdl.engine.losses import per_sample_loss

    n, steps, size = int(run.comm.n_nodes), int(run.cfg.steps), len(world)
    if size * max(steps, n) > MAX_CELLS:
        raise ConfigError(f"{size} trials x {steps} steps is too large for one audit")
    base = run.oracle
    oracle = base.rows(list(range(n)) * size)  # node b n + i is node i of copy (trial) b
    x = oracle.x.clone()
    slot = CANARY_ENTRY * int(base.block_size)
    x[::n, slot, 0] = torch.as_tensor(world, dtype=x.dtype) * CANARY_SCALE * float(run.cfg.clip)
    oracle = replace(oracle, x=x)
    rec = _Recording(run.comm)
    comm = _Copies(rec, size)
    first = run.recipe.initial_params(run.cfg, run.task)
    params = {k: v.repeat(size, *([1] * (v.dim() - 1))) for k, v in first.items()}
    state = run.algorithm.init(params, oracle, cast(Communicator, comm), keys=Keys.from_seed(seed))
    parts = []
    for _ in range(steps):
        state, _ = run.algorithm.step(state, oracle, cast(Communicator, comm))
        sent, _ = rec.take()
        parts.append(sent[-1][0])  # node 0's message in every copy
    if not black_box:
        return torch.stack(parts).T.to(torch.float64).numpy()
    final = state.params  # (size n, ...): every node's de-biased model, copy after copy
    canary = torch.full((size * n, 1, 1), CANARY_SCALE * float(run.cfg.clip))
    with torch.no_grad():
        out = run.task.model.forward(final, canary.to(next(iter(final.values())).dtype))
        loss = per_sample_loss(out, torch.ones((size * n, 1), dtype=torch.int64),
                               run.task.loss_name)  # fmt: skip
    return loss.reshape(size, n).to(torch.float64).numpy()
