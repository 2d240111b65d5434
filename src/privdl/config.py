"""Typed run configuration: TOML files or CLI flags -> a validated :class:`RunConfig`.

Unknown keys are errors (pydantic ``extra="forbid"``); every validation failure becomes a one-line
:class:`~privdl.errors.ConfigError`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from privdl.errors import ConfigError

ALGORITHMS = ("dsgd", "ldp", "decor", "cdp", "porter-dp", "porter-gc", "privsgp", "privsgp-vr")
#: PORTER variants (Li & Chi, Algorithm 1) and PrivSGP variants (Zhu et al., Algorithms 1-2).
PORTER = ("porter-dp", "porter-gc")
PRIVSGP = ("privsgp", "privsgp-vr")
#: Consensus step size gamma of PORTER when not given (the porter-a9a preset's tuned value).
DEFAULT_PORTER_GAMMA = 0.05
#: Largest graph whose PORTER default mixing is FDLA: its subgradient solver does 2000 dense
#: eigendecompositions (~5 s at n = 128, ~20 s at 256 on 2 CPU cores, growing as n^3).
FDLA_DEFAULT_MAX_NODES = 256
TASKS = ("least-squares", "a9a", "mnist", "fashion-mnist", "cifar10", "synthetic-cifar10")


class RunConfig(BaseModel):
    """Everything that defines one training run (the resolved copy is saved with its records)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Literal[
        "dsgd", "ldp", "decor", "cdp", "porter-dp", "porter-gc", "privsgp", "privsgp-vr"
    ] = "dsgd"
    task: Literal[
        "least-squares", "a9a", "mnist", "fashion-mnist", "cifar10", "synthetic-cifar10"
    ] = "a9a"
    model: str | None = None
    graph: str = "ring:16"
    # None: "fdla" for PORTER (its experiments, spec porter.md §6.1; "best-constant" above
    # FDLA_DEFAULT_MAX_NODES nodes, where FDLA's solver takes minutes), "metropolis" otherwise
    mixing: (
        Literal["decor", "metropolis", "max-degree", "average", "fdla", "best-constant"] | None
    ) = None
    steps: int = Field(default=500, ge=1)
    lr: float = 0.1
    lr_decay: float | None = None
    batch_size: int = Field(default=64, ge=1)
    sampling: Literal["without_replacement", "poisson", "full"] = "without_replacement"
    clip: float | None = None
    clip_mode: Literal["none", "per_sample", "batch_mean"] = "none"
    clip_kind: Literal["hard", "smooth"] = "hard"
    sigma: float = 0.0
    sigma_cor: float = 0.0
    weight_decay: float = 0.0
    partition: str = "iid"
    seed: int = 0
    data_seed: int = 1
    eval_every: int = Field(default=50, ge=1)
    device: str = "cpu"
    dtype: Literal["float32", "float64"] = "float32"
    data_dir: str | None = None
    ls_dim: int = Field(default=10, ge=1)
    epsilon: float | None = None
    delta: float | None = None
    adversary: str = "eavesdropper"
    label: str | None = None
    # PORTER: compressor spec (mechanisms.compress.parse_compressor; "random:F" = "randk:F") and
    # consensus step size gamma (eq. 12, 14); PrivSGP-VR: samples per SAGA table entry (block).
    compressor: str | None = None
    gamma: float | None = None
    block_size: int = Field(default=1, ge=1)
    # Keyed Gaussian streams (privdl.mechanisms.prng); "auto" is resolved from ``device`` when the
    # run starts and the resolved name is saved, so a resumed run keeps its streams.
    noise_backend: Literal["auto", "aes-ziggurat", "chacha20", "torch"] = "auto"

    @field_validator("lr", "sigma", "sigma_cor", "weight_decay")
    @classmethod
    def _finite_nonneg(cls, v: float, info) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{info.field_name} must be a finite number >= 0")
        if info.field_name == "lr" and v == 0:
            raise ValueError("lr must be > 0")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if re.fullmatch(r"cpu|cuda(:\d+)?", v.strip().lower()) is None:
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {v!r}")
        return v.strip().lower()

    @field_validator("clip")
    @classmethod
    def _clip(cls, v: float | None) -> float | None:
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError("clip must be a positive number")
        return v

    @field_validator("compressor")
    @classmethod
    def _compressor(cls, v: str | None) -> str | None:
        if v is None:
            return v
        name, sep, arg = v.strip().lower().partition(":")
        spec = ("randk" if name == "random" else name) + sep + arg
        from privdl.mechanisms.compress import parse_compressor

        try:
            parse_compressor(spec)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return spec

    @field_validator("gamma")
    @classmethod
    def _gamma(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and 0.0 < v <= 1.0):
            raise ValueError("the consensus step size gamma must be in (0, 1]")
        return v

    @field_validator("partition")
    @classmethod
    def _partition(cls, v: str) -> str:
        kind, _, arg = v.partition(":")
        if kind == "iid" and not arg:
            return v
        if kind in ("dirichlet", "shards"):
            try:
                x = float(arg)
            except ValueError:
                raise ValueError(f"partition {v!r}: expected dirichlet:ALPHA or shards:K") from None
            if not math.isfinite(x) or x <= 0:
                raise ValueError(f"partition {v!r}: parameter must be positive")
            return v
        raise ValueError(f"unknown partition {v!r}; expected iid, dirichlet:ALPHA or shards:K")

    def with_updates(self, **changes: Any) -> RunConfig:
        """A validated copy with ``changes`` applied."""
        return make_config({**self.model_dump(), **changes})


def make_config(values: dict[str, Any]) -> RunConfig:
    """Validate a mapping into a :class:`RunConfig`; errors become one-line ConfigErrors."""
    try:
        cfg = RunConfig(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ())) or "config"
        if err.get("type") == "extra_forbidden":
            raise ConfigError(f"unknown config key {loc!r}") from None
        msg = err.get("msg", "invalid value").removeprefix("Value error, ")
        raise ConfigError(f"invalid config value for {loc!r}: {msg}") from None
    if cfg.clip_mode != "none" and cfg.clip is None:
        raise ConfigError(f"clip_mode={cfg.clip_mode!r} needs a clipping threshold (--clip C)")
    if cfg.clip is not None and cfg.clip_mode == "none":
        mode = "batch_mean" if cfg.algorithm == "porter-gc" else "per_sample"
        cfg = cfg.model_copy(update={"clip_mode": mode})
    _refuse_ignored_options(cfg, values)
    cfg = _resolve_family_options(cfg)
    if cfg.delta is not None and not 0.0 < cfg.delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {cfg.delta}")
    if cfg.epsilon is not None and not (math.isfinite(cfg.epsilon) and cfg.epsilon > 0):
        raise ConfigError(f"epsilon must be positive, got {cfg.epsilon}")
    return cfg


def _refuse_ignored_options(cfg: RunConfig, values: dict[str, Any]) -> None:
    """Options the chosen algorithm or task would silently ignore are errors, named."""
    default = {k: f.default for k, f in RunConfig.model_fields.items()}
    if cfg.algorithm != "decor" and values.get("adversary", default["adversary"]) != "eavesdropper":
        raise ConfigError(
            f"adversary applies to decor (its SecLDP threat models); {cfg.algorithm} is "
            "accounted against its own (ldp for per-node noise, central for cdp)"
        )
    if cfg.task != "least-squares" and cfg.ls_dim != default["ls_dim"]:
        raise ConfigError(f"ls_dim is least-squares' dimension; task {cfg.task} has its own data")
    ignored = [
        k
        for k in ("model", "partition", "sampling", "batch_size")
        if k in values and values[k] != default[k]
    ]
    if cfg.task == "least-squares" and ignored:
        raise ConfigError(
            "least-squares has its own linear model and per-node data, and every node takes its "
            f"full local gradient (DECOR §6.2): drop {', '.join(ignored)}, or pick a supervised "
            "task (a9a, mnist, fashion-mnist, cifar10, synthetic-cifar10)"
        )


def _resolve_family_options(cfg: RunConfig) -> RunConfig:
    """Per-algorithm defaults and the options that only one family of algorithms takes."""
    porter, privsgp = cfg.algorithm in PORTER, cfg.algorithm in PRIVSGP
    if not porter and cfg.compressor is not None:
        raise ConfigError(f"compressor applies to porter-dp/porter-gc, not {cfg.algorithm!r}")
    if not porter and cfg.gamma is not None:
        raise ConfigError(f"gamma (consensus step) applies to PORTER, not {cfg.algorithm!r}")
    if not privsgp and cfg.block_size != 1:
        raise ConfigError(f"block_size applies to privsgp/privsgp-vr, not {cfg.algorithm!r}")
    if cfg.graph.strip().lower().startswith("expo:") and not privsgp:
        raise ConfigError(
            f"graph {cfg.graph!r} is time-varying and directed (push-sum): only privsgp and "
            "privsgp-vr run on it"
        )
    if cfg.algorithm == "porter-gc" and cfg.clip_mode == "per_sample":
        raise ConfigError("porter-gc clips the minibatch mean: use clip_mode batch_mean")
    if privsgp and cfg.clip_mode == "batch_mean":
        raise ConfigError(f"{cfg.algorithm} clips per sample: use clip_mode per_sample")
    updates: dict[str, Any] = {}
    if cfg.mixing is None:
        updates["mixing"] = "metropolis"
        if porter:
            from privdl.topology import parse_topology

            small = parse_topology(cfg.graph).n <= FDLA_DEFAULT_MAX_NODES
            updates["mixing"] = "fdla" if small else "best-constant"
    if porter and cfg.compressor is None:
        updates["compressor"] = "none"
    if porter and cfg.gamma is None:
        updates["gamma"] = DEFAULT_PORTER_GAMMA
    return cfg.model_copy(update=updates) if updates else cfg


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into a flat mapping (a ``[run]`` table, if present, is used)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from None
    return dict(data.get("run", data))
