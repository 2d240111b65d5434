"""Typed run configuration: the options every run shares, and TOML config files.

A run's configuration is one pydantic model per family of algorithms (a discriminated union on
``algorithm``): :class:`CommonConfig` holds what every run has (task, model, steps, seeds,
privacy target, device); each recipe (:mod:`privdl.recipes`) extends it with its family's options
(a graph and noise for gossip, a compressor for PORTER, clients and budgets for federated
learning). :func:`privdl.registry.make_config` picks the model from ``algorithm`` and validates;
CLI options and TOML presets go through the same models. Unknown keys are errors (pydantic
``extra="forbid"``); every failure becomes a one-line :class:`~privdl.errors.ConfigError`.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from privdl.accounting.secrdp import parse_adversary
from privdl.errors import ConfigError, PrivdlError
from privdl.mechanisms.compress import parse_compressor

__all__ = [
    "MAX_STEPS",
    "TASKS",
    "CommonConfig",
    "RunConfig",
    "format_validation_error",
    "load_config_file",
    "parse_adversary_label",
    "parse_compressor_spec",
]

#: The most steps (federated: rounds) a run may have. The keyed noise streams count their
#: draws in a 64-bit counter (2^64 blocks in all, shared by every step), and 10^9 steps is
#: already beyond what any machine finishes: a larger number is a typo, refused before any
#: calibration or training starts.
MAX_STEPS = 10**9

TASKS = ("least-squares", "a9a", "mnist", "fashion-mnist", "cifar10", "synthetic-cifar10", "user")


class CommonConfig(BaseModel):
    """What every run has; the family models add theirs (the resolved copy is saved with the
    run's records as ``config.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: str = Field(description="The algorithm (privdl algorithms lists them).")
    task: Literal[
        "least-squares", "a9a", "mnist", "fashion-mnist", "cifar10", "synthetic-cifar10", "user"
    ] = Field(
        default="a9a",
        description="least-squares, a9a, mnist, fashion-mnist, cifar10, synthetic-cifar10 "
        "(user: your own data, from Python)",
    )
    model: str | None = Field(
        default=None,
        description="Model name (default per task), or your nn.Module as package.module:Name.",
    )
    steps: int = Field(default=500, ge=1, description="Iterations (federated: rounds).")
    lr: float = Field(default=0.1, description="Learning rate (step size).")
    batch_size: int = Field(default=64, ge=1, description="Minibatch size per node.")
    sampling: Literal["without_replacement", "poisson", "full"] = Field(
        default="without_replacement", description="without_replacement, poisson or full."
    )
    clip: float | None = Field(default=None, description="Clipping threshold C.")
    clip_mode: Literal["none", "per_sample", "batch_mean"] = Field(
        default="none", description="per_sample, batch_mean or none."
    )
    # unset (None): the algorithm's own (smooth, Definition 2, for PORTER; hard elsewhere),
    # resolved when the config is built and saved with it
    clip_kind: Literal["hard", "smooth"] | None = Field(
        default=None, description="hard or smooth clipping (default: the algorithm's own)."
    )
    partition: str = Field(default="iid", description="iid, dirichlet:ALPHA or shards:K.")
    seed: int = Field(default=0, ge=0, description="Seed of the run (initial model, keys).")
    data_seed: int = Field(default=1, ge=0, description="Seed of the data partition.")
    eval_every: int = Field(default=50, ge=1, description="Evaluate and checkpoint every N steps.")
    device: str = Field(default="cpu", description="cpu, cuda or cuda:N.")
    dtype: Literal["float32", "float64"] = Field(
        default="float32", description="float32 or float64."
    )
    data_dir: str | None = Field(
        default=None, description="Where dataset files are looked up first."
    )
    ls_dim: int = Field(default=10, ge=1, description="Dimension of the least-squares task.")
    epsilon: float | None = Field(
        default=None, description="Target epsilon: the noise is calibrated to it."
    )
    delta: float | None = Field(default=None, description="Target delta (default 1e-5).")
    accountant: Literal["tightest", "rdp"] = Field(
        default="tightest",
        description="tightest (default): the smallest certified epsilon, exact Gaussian (mu-GDP) "
        "for user-level and unsampled noise, the smaller of dp-accounting's PLD and RDP for "
        "sampled minibatches; rdp: privdl 0.1's RDP accounting (classic conversion at user "
        "level), for comparison. Calibration inverts the chosen one.",
    )
    label: str | None = Field(default=None, description="A name for the run in reports.")
    # Where the noise keys (and DECOR's X25519 key pairs) come from: "seed" derives them from
    # ``seed`` (reproducible simulation; anyone who knows the seed can rebuild every noise draw),
    # "os" from the operating system's randomness (kept only in the run's checkpoint).
    key_source: Literal["seed", "os"] = Field(
        default="seed",
        description="seed (default: noise keys and DECOR's key pairs derived from --seed, a "
        "reproducible simulation) or os (operating-system randomness; kept only in the "
        "checkpoint, under privdl launch in OUT/keys/rank-R.pt).",
    )
    # Authenticated key agreement (docs/security.md s.3): DECOR's X25519 keys travel signed by
    # each node's Ed25519 identity and are verified against the roster before the agreement.
    roster: str | None = Field(
        default=None,
        description="Roster of the nodes' Ed25519 identities (a privdl-roster/v1 JSON file, from "
        "privdl identities): DECOR's key agreement is authenticated and a substituted key refused; "
        "'seed' derives the identities from --seed (simulation only).",
    )
    identities: str | None = Field(
        default=None,
        description="Folder holding the identity keys node-I.ed25519 of the nodes this process "
        "runs (needed with a roster file).",
    )

    @model_validator(mode="after")
    def _authentication(self) -> Any:
        """A roster file needs the owned nodes' identity keys; identity keys need a roster; a
        roster derived from the seed authenticates nothing outside a simulation."""
        if self.identities is not None and self.roster is None:
            raise ValueError("identities are checked against a roster: give --roster FILE too")
        if self.roster == "seed":
            if self.identities is not None:
                raise ValueError("roster = 'seed' derives the identities: drop --identities")
            if self.key_source == "os":
                raise ValueError(
                    "roster = 'seed' (identities derived from the seed) authenticates nothing "
                    "under key_source os: give a roster file and --identities (privdl identities)"
                )
        elif self.roster is not None and self.identities is None:
            raise ValueError(
                f"roster {self.roster} needs the identity keys of this process's nodes: "
                "--identities FOLDER"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _no_booleans(cls, values: Any) -> Any:
        """No option is a switch: ``steps=True`` is refused (pydantic would read it as 1)."""
        if isinstance(values, dict):
            for key, value in values.items():
                if isinstance(value, bool) and key in cls.model_fields:
                    raise ValueError(
                        f"{key}={value!r}: {key} takes a number or a name, not true/false"
                    )
        return values

    @field_validator("steps", mode="before")
    @classmethod
    def _steps_limit(cls, v: Any) -> Any:
        """A number of steps above :data:`MAX_STEPS` (``1e23`` in a TOML file, a typo) is
        refused with why, before pydantic reads it as an integer."""
        if isinstance(v, int | float) and not isinstance(v, bool) and v > MAX_STEPS:
            shown = f"{v:.3g}" if isinstance(v, float) or v >= 10**12 else str(v)
            raise ValueError(
                f"steps = {shown} is more than privdl's limit of 10^9 (the noise streams count "
                "draws in a 64-bit counter, and no run that long ends); give fewer steps"
            )
        return v

    @field_validator("lr")
    @classmethod
    def _lr(cls, v: float) -> float:
        if not math.isfinite(v) or v <= 0:
            raise ValueError("lr must be a finite number > 0")
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

    def with_updates(self, **changes: Any) -> CommonConfig:
        """A copy with ``changes`` applied, validated by this configuration's model (same
        algorithm; e.g. the noise levels a calibration found, another seed)."""
        try:
            return type(self).model_validate({**self.model_dump(), **changes})
        except ValidationError as exc:
            raise format_validation_error(exc) from None


#: The type of a resolved run configuration: one of the recipes' models (all extend this one).
RunConfig = CommonConfig


def finite_nonnegative(name: str, v: float) -> float:
    """``v`` if it is a finite number >= 0 (noise levels, weight decay)."""
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0")
    return v


def parse_adversary_label(v: str) -> str:
    """One label per threat model (``collusion:0`` is the eavesdropper, ``collusion:1`` the
    curious user), as the SecRDP accountant labels its budgets."""
    try:
        return parse_adversary(v).label
    except PrivdlError as exc:
        raise ValueError(str(exc)) from None


def parse_compressor_spec(v: str | None) -> str | None:
    """A compressor spec (``random:F`` is ``randk:F``), checked by the compressor parser."""
    if v is None:
        return v
    name, sep, arg = v.strip().lower().partition(":")
    spec = ("randk" if name == "random" else name) + sep + arg
    try:
        parse_compressor(spec)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return spec


def format_validation_error(exc: ValidationError) -> ConfigError:
    """The first error of a pydantic validation as one line."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ())) or "config"
    if err.get("type") == "extra_forbidden":
        return ConfigError(f"unknown config key {loc!r}")
    msg = err.get("msg", "invalid value").removeprefix("Value error, ")
    if not err.get("loc"):  # a whole-config check names its key in the message
        return ConfigError(f"invalid config value: {msg}")
    return ConfigError(f"invalid config value for {loc!r}: {msg}")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into a flat mapping (a ``[run]`` table, if present, is used)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a directory; give a .toml file")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (TOML is)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from None
    if "run" in data and isinstance(data["run"], dict):
        outside = sorted(k for k in data if k != "run")
        if outside:
            raise ConfigError(
                f"config file {str(p)!r} has keys outside its [run] table ({', '.join(outside)}): "
                "put every key in [run], or drop the table header"
            )
        return dict(data["run"])
    return dict(data)
