"""PORTER (Li & Chi): gradient tracking with compressed surrogates, private or clipped.

A :class:`PorterRecipe` instance is PORTER-DP (``noise=True``: per-sample clipping and Gaussian
noise, Algorithm 1 option I, eqs. (6)-(7); accounted exactly as per-node (LDP) noise, since every
message is post-processing of the noisy gradients) or PORTER-GC (``noise=False``: the minibatch
mean clipped, option II, eqs. (9)-(10); no noise, no guarantee).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, field_validator

from privdl.accounting.nominal import porter_sigma
from privdl.algorithms.base import StepSize
from privdl.algorithms.porter import Porter
from privdl.config import CommonConfig, parse_compressor_spec
from privdl.engine.grads import ClipSpec
from privdl.errors import ConfigError
from privdl.mechanisms.compress import parse_compressor
from privdl.privacy import calibrate_noise, spent, target_delta, with_key_note
from privdl.recipes.base import Run, refuse_non_private
from privdl.recipes.decentralized import DecentralizedConfig, DecentralizedRecipe
from privdl.topology import parse_topology
from privdl.tree import Tree

__all__ = ["DEFAULT_PORTER_GAMMA", "FDLA_DEFAULT_MAX_NODES", "PorterConfig", "PorterRecipe"]

#: Consensus step size gamma of PORTER when not given (the porter-a9a preset's tuned value).
DEFAULT_PORTER_GAMMA = 0.05
#: Largest graph whose PORTER default mixing is FDLA: its subgradient solver does 2000 dense
#: eigendecompositions (~5 s at n = 128, ~20 s at 256 on 2 CPU cores, growing as n^3).
FDLA_DEFAULT_MAX_NODES = 256


class PorterConfig(DecentralizedConfig):
    """Options of the PORTER family: the compressor and the consensus step size."""

    # PORTER: compressor spec (mechanisms.compress.parse_compressor; "random:F" = "randk:F") and
    # consensus step size gamma (eq. 12, 14)
    compressor: str | None = Field(
        default=None,
        description="PORTER compressor: none, randk:F (alias random:F), urandk:F, bernk:F, "
        "topk:F, qsgd:L.",
    )
    gamma: float | None = Field(
        default=None, description="PORTER consensus step size gamma in (0, 1]."
    )

    @field_validator("compressor")
    @classmethod
    def _compressor(cls, v: str | None) -> str | None:
        return parse_compressor_spec(v)

    @field_validator("gamma")
    @classmethod
    def _gamma(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and 0.0 < v <= 1.0):
            raise ValueError("the consensus step size gamma must be in (0, 1]")
        return v


class PorterRecipe(DecentralizedRecipe):
    """PORTER-DP (``noise=True``) or PORTER-GC (``noise=False``); module docstring."""

    config_model: ClassVar[type[CommonConfig]] = PorterConfig
    default_clip_kind = "smooth"  # Definition 2

    def __init__(self, *, noise: bool) -> None:
        self.noise = noise
        self.default_clip_mode = "per_sample" if noise else "batch_mean"

    def default_mixing(self, cfg: Any) -> str:
        # PORTER's experiments (Li & Chi, Section 6) use the FDLA matrix
        small = parse_topology(cfg.graph).n <= FDLA_DEFAULT_MAX_NODES
        return "fdla" if small else "best-constant"

    def resolve(self, cfg: Any, given: Mapping[str, Any]) -> Any:
        alg = cfg.algorithm
        if not self.noise:
            refuse_non_private(cfg, given, private_names="the algorithms that add noise")
            if cfg.clip_mode == "per_sample":
                raise ConfigError(f"{alg} clips the minibatch mean: use clip_mode batch_mean")
        elif cfg.clip_mode == "batch_mean":
            raise ConfigError(
                f"{alg} clips each sample's gradient (Algorithm 1, option I): use clip_mode "
                "per_sample, or the clipped-minibatch variant (option II) for a clipped mean"
            )
        cfg = super().resolve(cfg, given)
        updates: dict[str, Any] = {}
        if cfg.compressor is None:
            updates["compressor"] = "none"
        if cfg.gamma is None:
            updates["gamma"] = DEFAULT_PORTER_GAMMA
        return cfg.model_copy(update=updates) if updates else cfg

    def calibrate(self, cfg: Any, topology: Any, task: Any) -> Any:
        if cfg.epsilon is not None and cfg.sigma > 0:
            raise ConfigError("give either a target epsilon or an explicit sigma, not both")
        if cfg.epsilon is None:
            return cfg
        if not self.noise:
            raise ConfigError(
                f"{cfg.algorithm} adds no noise, so no epsilon can be reached; use the "
                "private variant for a target"
            )
        return cfg.with_updates(**calibrate_noise(cfg, topology, task, noise="local"))

    def algorithm(self, cfg: Any, topology: Any, task: Any) -> Porter:
        """PORTER-DP (Option I, eqs. (6)-(7)) or PORTER-GC (Option II, eqs. (9)-(10))."""
        alg = cfg.algorithm
        if cfg.clip_mode == "none":
            raise ConfigError(f"{alg} needs clipping (set clip)")
        if not self.noise and cfg.sigma > 0:
            raise ConfigError(f"{alg} adds no noise (sigma must be 0); use the private variant")
        if self.noise and cfg.sigma <= 0:
            raise ConfigError(f"{alg} needs a noise std sigma > 0 or a target epsilon")
        clip = ClipSpec(mode=cfg.clip_mode, threshold=cfg.clip, kind=cfg.clip_kind)
        bits = 64 if cfg.dtype == "float64" else 32
        comp = parse_compressor(cfg.compressor or "none", value_bits=bits)
        gamma = float(cfg.gamma) if cfg.gamma is not None else DEFAULT_PORTER_GAMMA
        return Porter(
            StepSize(cfg.lr, cfg.lr_decay),
            gamma,
            comp,
            clip,
            cfg.sigma,
            name=alg,
            noise_backend=cfg.noise_backend,
        )

    def initial_params(self, cfg: Any, task: Any) -> Tree:
        """PORTER starts every agent at the same point (row 0, its Section 2.2)."""
        params = task.init_params(seed=cfg.seed)
        return {k: v[:1].expand_as(v).clone() for k, v in params.items()}

    def accountant(self, cfg: Any, topology: Any, task: Any, algorithm: Any) -> Any:
        if not self.noise or cfg.sigma <= 0:
            return None
        return with_key_note(
            spent(cfg, topology, task, noise="local", sigma=cfg.sigma), cfg.key_source
        )

    def calibration_record(self, run: Run) -> dict[str, Any] | None:
        """The accounted sigma beside Theorem 1's ``sigma_p = tau sqrt(T ln(1/delta)) / (m eps)``
        (b = 1 in the paper; labelled nominal)."""
        cfg, task = run.cfg, run.task
        if cfg.epsilon is None or not self.noise:
            return None
        delta = target_delta(cfg)
        out = run.accounted_record(delta)
        if getattr(task, "kind", "") != "supervised":
            return out  # full local gradients: Theorem 1's sampling formula does not apply
        m = int(task.data.counts.min())
        out["nominal"] = {
            "sigma": porter_sigma(
                tau=float(cfg.clip),
                steps=cfg.steps,
                delta=delta,
                local_samples=m,
                epsilon=cfg.epsilon,
            ),
            "accountant": "nominal:porter-thm1",
            "nominal": True,
            "notes": f"paper formula with b = 1, m = {m}; not a certified guarantee",
        }
        return out
