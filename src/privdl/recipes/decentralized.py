"""What the decentralized families share: a graph, its mixing rule, a noise std and its streams.

:class:`DecentralizedConfig` adds to every run's options the communication graph (``graph``,
``mixing``), the step-size decay, the Gaussian noise std ``sigma`` and the keyed noise streams
(``noise_backend``); :class:`DecentralizedRecipe` builds the graph's mixing matrix (or PrivSGP-VR's
time-varying exponential graph) and resolves the noise backend for the device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from privdl.config import CommonConfig
from privdl.errors import ConfigError
from privdl.mechanisms.prng import resolve_backend
from privdl.recipes.base import Recipe
from privdl.topology import ExponentialGraph, mixing_matrix, parse_topology

__all__ = ["DecentralizedConfig", "DecentralizedRecipe", "time_varying"]


def time_varying(graph: str) -> bool:
    """Whether a graph spec names the time-varying exponential graph (its own push-sum weights)."""
    return graph.strip().lower().startswith("expo:")


class DecentralizedConfig(CommonConfig):
    """A run of nodes on a graph (gossip, PORTER, PrivSGP families)."""

    graph: str = Field(
        default="ring:16",
        description="Graph spec, e.g. ring:16, torus:4x4, an edge-list file, or expo:N "
        "(push-sum algorithms).",
    )
    # None: the family's own (metropolis; PORTER: fdla up to FDLA_DEFAULT_MAX_NODES nodes,
    # best-constant above), resolved when the config is built and saved with it
    mixing: (
        Literal["decor", "metropolis", "max-degree", "average", "fdla", "best-constant"] | None
    ) = Field(
        default=None,
        description="decor, metropolis, max-degree, average, fdla, best-constant (default: fdla "
        "for PORTER up to 256 nodes, best-constant above; metropolis otherwise).",
    )
    lr_decay: float | None = Field(default=None, description="eta_t = lr/(1 + t/DECAY).")
    sigma: float = Field(
        default=0.0,
        description="Gaussian noise std (LDP/CDP/DECOR sigma, PORTER sigma_p, PrivSGP).",
    )
    # Keyed Gaussian streams (privdl.mechanisms.prng); "auto" is resolved from ``device`` when the
    # run starts and the resolved name is saved, so a resumed run keeps its streams.
    noise_backend: Literal["auto", "aes-ziggurat", "chacha20", "torch"] = Field(
        default="auto",
        description="Keyed Gaussian streams: auto (aes-ziggurat on CPU, chacha20 on CUDA), "
        "aes-ziggurat, chacha20 or torch (docs/secrets.md).",
    )

    # docs/security.md s.4: lattice-valued noise against floating-point attacks
    noise_mode: Literal["float", "secure", "secure-exact"] = Field(
        default="float",
        description="float (default: keyed float32 Gaussian streams) or secure (ldp, decor, cdp, "
        "dpsgd: discrete Gaussians on a power-of-two grid and the clipped gradient snapped to "
        "it, accounted by RDP at user level, keys from the OS unless --key-source seed is "
        "given; docs/security.md) or secure-exact (the same with CKS 2020's exact integer "
        "sampler, slower).",
    )

    @field_validator("sigma")
    @classmethod
    def _sigma(cls, v: float) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError("sigma must be a finite number >= 0")
        return v


#: The algorithms that run ``noise_mode = "secure"`` (docs/security.md s.4).
SECURE_ALGORITHMS = ("ldp", "decor", "cdp", "dpsgd")


class DecentralizedRecipe(Recipe):
    """Graph, mixing and noise streams of the decentralized families."""

    config_model: ClassVar[type[CommonConfig]] = DecentralizedConfig
    #: Whether the family runs push-sum, so the time-varying directed expo:N graph is allowed.
    push_sum: ClassVar[bool] = False

    def default_mixing(self, cfg: Any) -> str:
        """The mixing rule when none is given."""
        return "metropolis"

    def resolve(self, cfg: Any, given: Mapping[str, Any]) -> Any:
        if cfg.noise_mode != "float":
            if cfg.algorithm not in SECURE_ALGORITHMS:
                raise ConfigError(
                    f"noise_mode {cfg.noise_mode} is implemented for {', '.join(SECURE_ALGORITHMS)} "
                    f"(Gaussian noise on clipped gradients, user level), not {cfg.algorithm}"
                )
            if cfg.accountant != "rdp":
                if "accountant" in given:
                    raise ConfigError(
                        f"noise_mode {cfg.noise_mode} is certified by RDP only (the discrete Gaussian's "
                        f"zCDP bound; the {cfg.accountant} accountant's exact Gaussian curve is "
                        "the continuous Gaussian's): use --accountant rdp, the secure mode's "
                        "default"
                    )
                cfg = cfg.model_copy(update={"accountant": "rdp"})  # what certifies it, recorded
            if "key_source" not in given:  # a deployment's mode: keys nobody else can derive
                cfg = cfg.model_copy(update={"key_source": "os"})
        # (runs saved before this check recorded the then-default "metropolis" for expo: resumable)
        if given.get("mixing") not in (None, "metropolis") and time_varying(cfg.graph):
            raise ConfigError(f"graph {cfg.graph!r} has its own push-sum weights: drop mixing")
        if time_varying(cfg.graph) and not self.push_sum:
            raise ConfigError(
                f"graph {cfg.graph!r} is time-varying and directed (push-sum): {cfg.algorithm} "
                "does not run push-sum (privdl algorithms lists those that do)"
            )
        if cfg.mixing is None and not time_varying(cfg.graph):
            return cfg.model_copy(update={"mixing": self.default_mixing(cfg)})
        return cfg

    def prepare(self, cfg: Any) -> Any:
        if cfg.noise_backend == "auto":
            return cfg.model_copy(update={"noise_backend": resolve_backend("auto", cfg.device)})
        return cfg

    def n_nodes(self, cfg: Any) -> int:
        return parse_topology(cfg.graph).n

    def topology(self, cfg: Any) -> tuple[Any, Any]:
        topo = parse_topology(cfg.graph)
        if isinstance(topo, ExponentialGraph):  # PrivSGP's time-varying graph (config checks)
            return topo, topo
        topo.require_connected("decentralized training")
        return topo, mixing_matrix(topo, cfg.mixing or "metropolis")
