"""Noisy gossip: D-SGD and its private versions, by where the noise goes.

One family (DECOR, Allouah et al., ICML 2024, Algorithm 1, and its baselines): every node clips
its gradient, adds noise, takes a step and gossips with its neighbours. A
:class:`GossipRecipe` instance is one algorithm of the family, set by its ``noise`` kind:

* ``None`` — plain D-SGD (no clipping needed, no noise, no privacy);
* ``"local"`` — each node adds ``N(0, sigma^2 I)`` (DECOR's LDP baseline; threat model ``ldp``);
* ``"central"`` — exact averaging W = J on the complete graph with noise ``sigma/sqrt(n)`` per
  node, i.e. DP-SGD with a trusted aggregator (DECOR's CDP baseline; threat model ``central``;
  one node is plain DP-SGD);
* ``"correlated"`` — DECOR: ``sigma_cdp`` per node plus pairwise-cancelling ``sigma_cor`` per
  edge from X25519 secrets, accounted per threat model by the SecRDP accountant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from privdl.algorithms.base import StepSize
from privdl.algorithms.decor import Decor
from privdl.config import CommonConfig, parse_adversary_label
from privdl.engine.grads import ClipSpec
from privdl.errors import ConfigError, PrivacyError
from privdl.mechanisms.discrete_gaussian import grid_for
from privdl.mechanisms.noise_design import load_design
from privdl.optim import parse_optimizer
from privdl.privacy import (
    NoiseKind,
    calibrate_noise,
    privacy_unit,
    spent,
    step_rdp,
    target_delta,
    with_key_note,
)
from privdl.recipes.base import refuse_non_private
from privdl.recipes.decentralized import DecentralizedConfig, DecentralizedRecipe
from privdl.topology import complete, mixing_matrix, parse_topology

__all__ = ["GossipConfig", "GossipRecipe"]


class GossipConfig(DecentralizedConfig):
    """Options of the noisy-gossip family."""

    sigma_cor: float = Field(default=0.0, description="Correlated noise std (DECOR).")
    weight_decay: float = Field(default=0.0, description="Weight decay (outside the clipping).")
    adversary: str = Field(
        default="eavesdropper",
        description="eavesdropper, curious, collusion:Q or ldp (DECOR's threat models).",
    )
    noise_design: str | None = Field(
        default=None,
        description="DECOR: a variance per node and per edge instead of sigma and sigma_cor: a "
        "design file (privdl design-noise --out FILE) or 'optimized' (designed for the target "
        "epsilon when the run starts; docs/noise-design.md).",
    )
    optimizer: str | dict[str, Any] = Field(
        default="sgd",
        description="Applied per node to the privatized gradient: sgd, adam, adamw, or options "
        "as sgd:momentum=0.9,nesterov=true (with weight_decay: torch.optim's semantics).",
    )

    @field_validator("optimizer", mode="before")
    @classmethod
    def _optimizer(cls, v: Any) -> Any:
        """A canonical spec: ``"sgd"`` for plain SGD, else the optimizer's ``to_dict()``."""
        try:
            opt = parse_optimizer(optimizer_spec(v))
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        spec = opt.to_dict() if hasattr(opt, "to_dict") else v
        plain = {"name": "sgd", "momentum": 0.0, "dampening": 0.0, "nesterov": False}
        if isinstance(spec, dict) and {**plain, "weight_decay": 0.0} == spec:
            return "sgd"
        return spec

    @field_validator("sigma_cor", "weight_decay")
    @classmethod
    def _finite_nonneg(cls, v: float, info: Any) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{info.field_name} must be a finite number >= 0")
        return v

    @field_validator("adversary")
    @classmethod
    def _adversary(cls, v: str) -> str:
        return parse_adversary_label(v)


@cache
def _optimized_design(
    graph: str, epsilon: float, delta: float, steps: int, clip: float, adversary: str, mixing: str
) -> Any:
    """``noise_design = "optimized"``: designed once per setting (docs/noise-design.md)."""
    from privdl.design.api import design_noise
    from privdl.topology import parse_graph

    result = design_noise(
        parse_graph(graph), epsilon=epsilon, delta=delta, steps=steps, clip=clip,
        adversary=adversary, mixing=mixing,
    )  # fmt: skip
    return result.design


def optimizer_spec(v: Any) -> Any:
    """``"name:key=value,..."`` (the CLI form) as the mapping :func:`parse_optimizer` takes."""
    if not isinstance(v, str) or ":" not in v:
        return v
    name, _, rest = v.partition(":")
    out: dict[str, Any] = {"name": name.strip()}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = item.partition("=")
        if not eq:
            raise ConfigError(f"optimizer {v!r}: expected NAME:KEY=VALUE,...")
        text = raw.strip().lower()
        value: Any
        if text in ("true", "false"):
            value = text == "true"
        else:
            try:
                value = float(raw)
            except ValueError:
                raise ConfigError(f"optimizer {v!r}: {key.strip()} takes a number") from None
        out[key.strip()] = value
    return out


class GossipRecipe(DecentralizedRecipe):
    """One algorithm of the noisy-gossip family (module docstring); ``default_graph``: the graph
    a run takes when none is given (plain DP-SGD: one node)."""

    config_model: ClassVar[type[CommonConfig]] = GossipConfig

    def __init__(self, *, noise: NoiseKind | None, default_graph: str | None = None) -> None:
        self.noise: Literal["local", "central", "correlated"] | None = noise
        self.default_graph = default_graph

    def default_mixing(self, cfg: Any) -> str:
        # central noise: exact averaging W = J (DECOR's CDP baseline), whatever the graph
        return "average" if self.noise == "central" else "metropolis"

    def resolve(self, cfg: Any, given: Mapping[str, Any]) -> Any:
        if self.noise == "central":  # records what runs: exact averaging (configs that named
            cfg = cfg.model_copy(update={"mixing": "average"})  # another rule ran it too)
        if self.default_graph is not None and "graph" not in given:
            cfg = cfg.model_copy(update={"graph": self.default_graph})
        if self.noise != "correlated" and given.get("adversary", "eavesdropper") != "eavesdropper":
            against = {None: "no adversary (it adds no noise)", "local": "ldp (per-node noise)"}
            raise ConfigError(
                "adversary applies to correlated noise (DECOR's SecLDP threat models); "
                f"{cfg.algorithm} is accounted against "
                f"{against.get(self.noise, 'central (a trusted aggregator)')}"
            )
        if self.noise is None:
            refuse_non_private(cfg, given, private_names="the algorithms that add noise")
        return super().resolve(cfg, given)

    def topology(self, cfg: Any) -> tuple[Any, Any]:
        if self.noise != "central":
            return super().topology(cfg)
        # exact averaging W = J on the complete graph (DECOR's CDP baseline, Section 6)
        topo = complete(parse_topology(cfg.graph).n)
        return topo, mixing_matrix(topo, "average")

    def calibrate(self, cfg: Any, topology: Any, task: Any) -> Any:
        if cfg.noise_design is not None:
            self._check_design(cfg, task)
            return cfg
        if cfg.epsilon is not None and (cfg.sigma > 0 and self.noise != "correlated"):
            raise ConfigError("give either a target epsilon or an explicit sigma, not both")
        if cfg.epsilon is not None and cfg.sigma_cor > 0:
            raise ConfigError("give either a target epsilon or an explicit sigma_cor, not both")
        if cfg.epsilon is None or self.noise is None:
            return cfg
        if cfg.noise_mode != "float" and self.noise == "correlated":
            raise ConfigError(
                f"noise_mode {cfg.noise_mode} accounts DECOR by its independent noise alone (the "
                "correlated noise's SecRDP credit is the continuous Gaussian's), so a target "
                "epsilon calibrated by SecRDP would not hold: give sigma and sigma_cor"
            )
        levels = calibrate_noise(cfg, topology, task, noise=self.noise, adversary=cfg.adversary)
        return cfg.with_updates(**levels)

    def _check_design(self, cfg: Any, task: Any) -> None:
        if self.noise != "correlated":
            raise ConfigError(f"algorithm {cfg.algorithm} has no correlated noise to design")
        if cfg.sigma > 0 or cfg.sigma_cor > 0:
            raise ConfigError("give either a noise design or sigma / sigma_cor, not both")
        if cfg.noise_mode == "secure":
            raise ConfigError("the secure noise mode has no noise design")
        if cfg.noise_design == "optimized":
            if cfg.epsilon is None:
                raise ConfigError("noise_design optimized needs a target epsilon")
            if privacy_unit(cfg, task) != "user":
                raise ConfigError(
                    "noise_design optimized is calibrated at user level (sensitivity 2C per "
                    "step): use clip_mode batch_mean or sampling full, or design a file"
                )
        elif cfg.epsilon is not None:
            raise ConfigError(
                "a noise design file fixes the noise: drop epsilon (the run accounts the "
                "design's epsilon)"
            )

    def _design(self, cfg: Any, topology: Any) -> Any:
        """The run's noise design (None: the two sigmas)."""
        if self.noise != "correlated" or cfg.noise_design is None:
            return None
        if cfg.noise_design == "optimized":
            return _optimized_design(
                cfg.graph, float(cfg.epsilon), target_delta(cfg), int(cfg.steps),
                float(cfg.clip), cfg.adversary, cfg.mixing or "metropolis",
            )  # fmt: skip
        design = load_design(cfg.noise_design)
        design.check_graph(topology.edges, topology.n)
        return design

    def _optimizer(self, cfg: Any) -> tuple[Any, float]:
        """The optimizer (None: plain SGD) and the decoupled weight decay left to the step."""
        if cfg.optimizer == "sgd":
            return None, cfg.weight_decay
        spec = dict(cfg.optimizer)
        if cfg.weight_decay > 0:
            if spec.get("weight_decay", 0.0):
                raise ConfigError("give weight_decay once: as an option or in the optimizer")
            spec["weight_decay"] = cfg.weight_decay
        return parse_optimizer(spec), 0.0

    def algorithm(self, cfg: Any, topology: Any, task: Any) -> Any:
        alg = cfg.algorithm
        clip = ClipSpec(mode=cfg.clip_mode, threshold=cfg.clip, kind=cfg.clip_kind)
        step = StepSize(cfg.lr, cfg.lr_decay)
        optimizer, weight_decay = self._optimizer(cfg)
        if self.noise is None:
            if cfg.sigma > 0 or cfg.sigma_cor > 0:
                raise ConfigError(
                    f"algorithm {alg!r} is non-private: drop sigma and sigma_cor (choose an "
                    "algorithm that adds noise)"
                )
        elif cfg.clip_mode == "none":
            raise ConfigError(f"algorithm {alg!r} needs clipping (set clip)")
        elif self.noise == "correlated":
            if cfg.sigma <= 0 and cfg.noise_design is None:
                raise ConfigError(
                    f"algorithm {alg!r} needs sigma (sigma_cdp) > 0 or a target epsilon"
                )
        elif cfg.sigma <= 0:
            raise ConfigError(f"algorithm {alg!r} needs a noise std sigma > 0")
        elif cfg.sigma_cor > 0:
            raise ConfigError(f"algorithm {alg!r} has no correlated noise (sigma_cor)")
        if cfg.noise_mode != "float" and privacy_unit(cfg, task) != "user":
            raise ConfigError(
                f"noise_mode {cfg.noise_mode} is accounted at user level (no subsampling amplification, "
                "which is proved for the continuous Gaussian): use clip_mode batch_mean or "
                "sampling full"
            )
        # one step for the whole family: DECOR's, with the noise this algorithm adds
        return Decor(
            step,
            edges=topology.edges,
            n_nodes=topology.n,
            clip=clip,
            sigma_cdp=cfg.sigma,
            sigma_cor=cfg.sigma_cor,
            weight_decay=weight_decay,
            noise_backend=cfg.noise_backend,
            optimizer=optimizer,
            noise_mode=cfg.noise_mode,
            noise_design=self._design(cfg, topology),
        )

    def step_rdp(
        self, cfg: Any, topology: Any, task: Any, *, sigma: float, sigma_cor: float = 0.0
    ) -> float:
        """The per-step RDP slope of this algorithm's noise at ``sigma`` (and ``sigma_cor``)."""
        if self.noise is None:
            raise ConfigError(f"{cfg.algorithm} adds no noise: it has no privacy slope")
        return step_rdp(
            cfg, topology, task, noise=self.noise, adversary=cfg.adversary, sigma=sigma,
            sigma_cor=sigma_cor,
        )  # fmt: skip

    def accountant(self, cfg: Any, topology: Any, task: Any, algorithm: Any) -> Any:
        design = self._design(cfg, topology)
        if design is not None:
            return with_key_note(
                spent(cfg, topology, task, noise="correlated", adversary=cfg.adversary, sigma=0.0,
                      design=design),
                cfg.key_source,
            )  # fmt: skip
        if self.noise is None or cfg.sigma <= 0:
            return None
        secure = cfg.noise_mode != "float"
        # secure DECOR: accounted by each node's independent discrete Gaussian alone (LDP)
        noise = "local" if secure and self.noise == "correlated" else self.noise
        at = spent(
            cfg,
            topology,
            task,
            noise=noise,
            adversary=cfg.adversary,
            sigma=cfg.sigma,
            sigma_cor=0.0 if noise != self.noise else cfg.sigma_cor,
        )
        noted = with_key_note(at, cfg.key_source)
        if not secure:
            return noted
        note = "; ".join(
            secure_notes(
                self.noise, sigma=cfg.sigma, n=topology.n, exact=cfg.noise_mode == "secure-exact"
            )
        )

        def with_secure(t: int) -> dict[str, Any] | None:
            rec = noted(t)
            if rec is not None:
                rec["notes"] = "; ".join(x for x in (rec.get("notes"), note) if x)
                rec["mu"] = None  # the mu-GDP curve is the continuous Gaussian's
            return rec

        return with_secure


def secure_notes(noise: str, *, sigma: float, n: int, exact: bool = False) -> list[str]:
    """What certifies the secure mode's epsilon (docs/security.md s.4), for its records.

    Every release is lattice-valued with discrete Gaussian noise: a node's own
    ``N_Z(0, (sigma/gamma)^2)`` has the continuous Gaussian's zCDP (Canonne, Kamath & Steinke
    2020, Section 2), so the RDP accounting holds unchanged (``local``; the ``central`` sum
    below). The sum of ``n`` nodes' discrete Gaussians (``central``: exact averaging) is not a
    discrete Gaussian; Kairouz, Liu & Steinke 2021 (The Distributed Discrete Gaussian
    Mechanism, Theorem 1) bound it: ``rho = Delta^2 / (2 n sigma^2) + tau d / 4`` with
    ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 s^2 k / (k + 1)) <= 10 (n - 1) exp(-pi^2 s^2)``,
    ``s = sigma / gamma >= 2^20``: the extra term is 0 in float64 (below 2^-1000), checked
    here. DECOR's correlated noise is a signed sum of discrete Gaussians, not a Gaussian, so its
    SecRDP credit (proved for the continuous Gaussian) is not taken: ``correlated`` is accounted
    by the independent noise alone (LDP), which holds against every threat model.
    """
    grid = grid_for(sigma)
    notes = [
        f"secure noise: discrete Gaussian on the grid {grid:.6g} with the clipped gradient "
        "snapped to it (RDP of the discrete Gaussian <= the continuous one's; docs/security.md)"
    ]
    if exact:
        notes.append(
            "exact sampler (Canonne, Kamath & Steinke 2020, Algorithms 1-3, integer arithmetic) "
            f"at the integer scale {math.ceil(sigma / grid)} >= sigma / grid"
        )
    else:
        notes.append(
            "sampler with float64 acceptance tests (relative pmf error about 2^-32, not "
            "accounted; secure-exact removes it)"
        )
    if noise == "central" and n > 1:
        s = sigma / grid
        extra = 2.5 * (n - 1) * 2.0**62 * math.exp(-(math.pi**2) * s * s)  # any d <= 2^62
        if extra > 0:  # pragma: no cover - s >= 2^20 makes it underflow
            raise PrivacyError(f"the secure sum's extra zCDP term {extra:.3g} is not negligible")
        notes.append(
            f"the average of {n} discrete Gaussians: Kairouz, Liu & Steinke 2021 Thm 1, extra "
            "zCDP term tau d / 4 < 2^-1000"
        )
    if noise == "correlated":
        notes.append(
            "DECOR's correlated noise is a signed sum of discrete Gaussians, not credited: "
            "accounted by each node's independent noise alone (LDP; holds against every "
            "threat model)"
        )
    return notes
