"""White-box audits of PrivSGP-VR (Zhu et al., IJCAI 2024, Algorithm 1) as implemented.

The run is built by its recipe (noise calibrated to the target as ``privdl run`` does: K Gaussian
steps of sensitivity ``(4 - 2/J) C``, no subsampling amplification, because the SAGA mean depends
on every sample); its own ``init`` (the table's full pass) and ``step`` (lines 1-8: a random entry
``xi``, ``g = h - T[xi] + mean``, noise, push-sum) run on a *canary sample oracle*: entry ``j*`` of
node 0 is the canary sample, whose gradient is ``w s_t C`` at step ``t`` (``s_t = +-1`` a public
pattern, ``w = -1`` or ``+1`` the two neighbouring datasets, replace-one of one sample), every
other entry is zero. A sign that changes over time is what lets ``h - T[xi]`` reach ``2C`` per
world (the ``4C`` of the sensitivity); the sampled ``xi`` stay secret. Each trial is one
coordinate, so a batch of trials is one run. The adversary sees node 0's messages (its push-sum
half-steps), every step.
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

__all__ = ["CanarySamples", "privsgp_views"]

#: The canary's entry in node 0's table.
CANARY_ENTRY = 0


class CanarySamples:
    """A PrivSGP sample oracle (:class:`privdl.algorithms.privsgp.SampleOracle`) whose only
    non-zero entry is node 0's canary, ``world * s_t * C`` per trial at step ``t``."""

    def __init__(
        self, n_nodes: int, n_entries: int, clip: float, signs: np.ndarray, world: Tensor
    ) -> None:
        self.n_nodes, self.n_entries = n_nodes, n_entries
        self.entry_size = self.dim = int(world.numel())
        self.clip, self.signs, self.world = clip, signs, world
        self.step = 0  # entries() is called once per step, in order

    def _canary(self, t: int, dtype: torch.dtype) -> Tensor:
        return self.world.to(dtype) * float(self.signs[min(t, len(self.signs) - 1)] * self.clip)

    def entries(self, params: Tree, index: Tensor) -> tuple[Tensor, Tensor]:
        x = next(iter(params.values()))
        out = torch.zeros((self.n_nodes, self.dim), dtype=x.dtype)
        if int(index[0]) == CANARY_ENTRY:
            out[0] = self._canary(self.step, x.dtype)
        self.step += 1
        return out, torch.zeros(self.n_nodes, dtype=x.dtype)

    def expand(self, entry: Tensor, index: Tensor) -> Tensor:
        return entry

    def all_entries(self, params: Tree) -> Tensor:
        x = next(iter(params.values()))
        table = torch.zeros((self.n_nodes, self.n_entries, self.dim), dtype=x.dtype)
        table[0, CANARY_ENTRY] = self._canary(0, x.dtype)
        return table

    def table_mean(self, table: Tensor) -> Tensor:
        return table.mean(1)


def privsgp_views(run: Any, *, world: np.ndarray, signs: np.ndarray, seed: int) -> np.ndarray:
    """``(len(world), steps)``: node 0's messages, each trial's coordinate, every step."""
    from privdl.recipes.privsgp import privsgp_geometry

    n, steps, size = int(run.comm.n_nodes), int(run.cfg.steps), len(world)
    if size * steps > MAX_CELLS:
        raise ConfigError(f"{size} trials x {steps} steps is too large for one audit")
    entries, _ = privsgp_geometry(run.cfg, run.task)
    oracle = CanarySamples(n, int(entries), float(run.cfg.clip), signs, torch.as_tensor(world))
    comm = _Recording(run.comm)
    params = {"x": torch.zeros((n, size), dtype=torch.float64 if run.cfg.dtype == "float64"
                               else torch.float32)}  # fmt: skip
    keys = Keys.from_seed(seed)
    state = run.algorithm.init(params, oracle, cast(Communicator, comm), keys=keys)
    parts = []
    for _ in range(steps):
        state, _ = run.algorithm.step(state, oracle, cast(Communicator, comm))
        sent, _ = comm.take()
        parts.append(sent[-1][0])
    return torch.stack(parts).T.to(torch.float64).numpy()
