"""A toy algorithm defined only here, outside privdl, and registered from here.

"Heavy-ball gossip": each node takes a momentum step on its clipped gradient plus its own keyed
Gaussian noise, then gossips. It follows the algorithm protocol (``init``/``step``), brings its
own recipe (config model with one option of its own, ``beta``; calibration; accountant) and is
registered under ``toy-heavy-ball``. docs/adding-an-algorithm.md walks through this file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
from pydantic import Field

import privdl
from privdl.algorithms.base import Keys, StepInfo, StepSize, held_nodes
from privdl.comm.base import Communicator
from privdl.config import CommonConfig
from privdl.engine.grads import ClipSpec
from privdl.errors import ConfigError
from privdl.mechanisms.correlated import independent_noise
from privdl.privacy import calibrate_noise, spent, with_key_note
from privdl.recipes.decentralized import DecentralizedConfig, DecentralizedRecipe
from privdl.tree import Tree, flatten, unflatten

NAME = "toy-heavy-ball"


@dataclass
class HeavyBallState:
    """Models, momentum buffer (node-stacked, checkpointed by the loop), step, noise keys."""

    params: Tree
    momentum: torch.Tensor
    t: int = 0
    noise_keys: tuple[bytes, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class HeavyBallGossip:
    """``m_i <- beta m_i + g_i + N(0, sigma^2)``; ``x_i <- sum_j W_ij (x_j - eta m_j)``."""

    step_size: StepSize
    beta: float
    clip: ClipSpec
    sigma: float

    def init(self, params: Tree, oracle: Any, comm: Communicator, *, keys: Keys) -> HeavyBallState:
        nodes = held_nodes(comm, params)
        noise_keys = keys.node_noise_keys(nodes) if self.sigma > 0 else ()
        return HeavyBallState(params, torch.zeros_like(flatten(params)), 0, noise_keys)

    def step(
        self, state: HeavyBallState, oracle: Any, comm: Communicator
    ) -> tuple[HeavyBallState, StepInfo]:
        t = state.t
        res = oracle(state.params, t, clip=self.clip)
        g = flatten(res.grads)
        if self.sigma > 0:
            g = g + independent_noise(
                state.noise_keys, t, g.shape[1], sigma=self.sigma, dtype=g.dtype, device=g.device
            )
        m = self.beta * state.momentum + g
        half = unflatten(flatten(state.params) - self.step_size(t) * m, state.params)
        new = replace(state, params=comm.mix(half, t), momentum=m, t=t + 1)
        return new, {"loss": res.loss}


class HeavyBallConfig(DecentralizedConfig):
    """The family's options: those of every decentralized run, and the momentum ``beta``."""

    beta: float = Field(default=0.5, ge=0.0, lt=1.0, description="Toy: momentum beta.")


class HeavyBallRecipe(DecentralizedRecipe):
    """Per-node noise on clipped gradients: accounted as local (LDP) noise; the momentum is
    post-processing of the noisy gradients."""

    config_model: ClassVar[type[CommonConfig]] = HeavyBallConfig

    def resolve(self, cfg: Any, given: Mapping[str, Any]) -> Any:
        if cfg.clip is None:
            raise ConfigError(f"{cfg.algorithm} needs a clipping threshold (--clip C)")
        return super().resolve(cfg, given)

    def calibrate(self, cfg: Any, topology: Any, task: Any) -> Any:
        if cfg.epsilon is None:
            return cfg
        return cfg.with_updates(**calibrate_noise(cfg, topology, task, noise="local"))

    def algorithm(self, cfg: Any, topology: Any, task: Any) -> HeavyBallGossip:
        if not math.isfinite(cfg.sigma):
            raise ConfigError("sigma must be finite")
        clip = ClipSpec(mode=cfg.clip_mode, threshold=cfg.clip, kind=cfg.clip_kind)
        return HeavyBallGossip(StepSize(cfg.lr, cfg.lr_decay), cfg.beta, clip, cfg.sigma)

    def accountant(self, cfg: Any, topology: Any, task: Any, algorithm: Any) -> Any:
        if cfg.sigma <= 0:
            return None
        return with_key_note(
            spent(cfg, topology, task, noise="local", sigma=cfg.sigma), cfg.key_source
        )


privdl.register(NAME, HeavyBallRecipe(), description="toy heavy-ball gossip (tests)")
