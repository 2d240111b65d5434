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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from privdl.errors import ConfigError, PrivdlError

#: Federated algorithms (Robust-HDP, Malekmohammadi et al., Algorithm 1, and its Table 1
#: baselines): clients with heterogeneous budgets and a server that weights their updates.
FEDERATED = ("robust-hdp", "weiavg", "pfa", "dpfedavg", "mineps", "fedavg")
ALGORITHMS = (
    "dsgd", "ldp", "decor", "cdp", "porter-dp", "porter-gc", "privsgp", "privsgp-vr", *FEDERATED
)  # fmt: skip
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
        "dsgd", "ldp", "decor", "cdp", "porter-dp", "porter-gc", "privsgp", "privsgp-vr",
        "robust-hdp", "weiavg", "pfa", "dpfedavg", "mineps", "fedavg",
    ] = "dsgd"  # fmt: skip
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
    # unset (None): the algorithm's own (smooth, Definition 2, for PORTER; hard elsewhere),
    # resolved when the config is built and saved with it
    clip_kind: Literal["hard", "smooth"] | None = None
    sigma: float = 0.0
    sigma_cor: float = 0.0
    weight_decay: float = 0.0
    partition: str = "iid"
    seed: int = Field(default=0, ge=0)
    data_seed: int = Field(default=1, ge=0)
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
    # Where the noise keys and DECOR's X25519 key pairs come from: "seed" derives them from
    # ``seed`` (reproducible simulation; anyone who knows the seed can rebuild every noise draw),
    # "os" from the operating system's randomness (kept only in the run's checkpoint).
    key_source: Literal["seed", "os"] = "seed"
    # Federated runs (FEDERATED): the number of clients (a server, no graph; steps = rounds),
    # each client's epsilon ("Dist1".."Dist9": the Robust-HDP paper's 20-client lists with its
    # batch sizes; or a comma list, one value per client), local epochs K, clients sampled per
    # round, and Robust-HDP's re-estimation period (None: estimate once after round 1 and
    # freeze, as the reference code; 1: every round, the paper's Algorithm 1).
    clients: int | None = Field(default=None, ge=1)
    budgets: str | None = None
    local_epochs: int = Field(default=1, ge=1)
    clients_per_round: int | None = Field(default=None, ge=1)
    reestimate_every: int | None = Field(default=None, ge=1)

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

    @model_validator(mode="before")
    @classmethod
    def _algorithm_clip_kind(cls, values: Any) -> Any:
        """``clip_kind`` unset: PORTER's smooth operator (Definition 2), hard elsewhere (Eq. 1)."""
        if isinstance(values, dict) and values.get("clip_kind") is None:
            porter = values.get("algorithm") in PORTER
            values = {**values, "clip_kind": "smooth" if porter else "hard"}
        return values

    @field_validator("lr", "sigma", "sigma_cor", "weight_decay")
    @classmethod
    def _finite_nonneg(cls, v: float, info) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{info.field_name} must be a finite number >= 0")
        if info.field_name == "lr" and v == 0:
            raise ValueError("lr must be > 0")
        return v

    @field_validator("adversary")
    @classmethod
    def _adversary(cls, v: str) -> str:
        """One label per threat model (``collusion:0`` is the eavesdropper, ``collusion:1`` the
        curious user), as the accountant labels its budgets."""
        from privdl.accounting.secrdp import parse_adversary

        try:
            return parse_adversary(v).label
        except PrivdlError as exc:
            raise ValueError(str(exc)) from None

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

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, v: Any) -> Any:
        """A list of epsilons (Python, TOML) is the comma list the CLI takes."""
        if isinstance(v, list | tuple) and all(
            isinstance(e, int | float) and not isinstance(e, bool) for e in v
        ):
            return ",".join(repr(float(e)) for e in v)
        return v

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
        if not err.get("loc"):  # a whole-config check names its key in the message
            raise ConfigError(f"invalid config value: {msg}") from None
        raise ConfigError(f"invalid config value for {loc!r}: {msg}") from None
    if cfg.clip_mode != "none" and cfg.clip is None:
        raise ConfigError(f"clip_mode={cfg.clip_mode!r} needs a clipping threshold (--clip C)")
    if cfg.clip is not None and values.get("clip_mode") == "none":
        raise ConfigError(f"clip_mode='none' contradicts clip={cfg.clip}: drop one of them")
    if cfg.clip is not None and cfg.clip_mode == "none":
        mode = "batch_mean" if cfg.algorithm == "porter-gc" else "per_sample"
        cfg = cfg.model_copy(update={"clip_mode": mode})
    _refuse_ignored_options(cfg, values)
    if cfg.algorithm in FEDERATED:
        cfg = _resolve_federated(cfg, values)
    else:
        _refuse_federated_options(cfg)
        cfg = _resolve_family_options(cfg)
    if cfg.delta is not None and not 0.0 < cfg.delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {cfg.delta}")
    if cfg.epsilon is not None and not (math.isfinite(cfg.epsilon) and cfg.epsilon > 0):
        raise ConfigError(f"epsilon must be positive, got {cfg.epsilon}")
    return cfg


def _time_varying(graph: str) -> bool:
    """Whether a graph spec names the time-varying exponential graph (its own push-sum weights)."""
    return graph.strip().lower().startswith("expo:")


def _refuse_ignored_options(cfg: RunConfig, values: dict[str, Any]) -> None:
    """Options the chosen algorithm or task would silently ignore are errors, named."""
    default = {k: f.default for k, f in RunConfig.model_fields.items()}
    if cfg.algorithm != "decor" and values.get("adversary", default["adversary"]) != "eavesdropper":
        own = (
            "the server that sees each client's updates (example-level)"
            if cfg.algorithm in FEDERATED
            else "its own (ldp for per-node noise, central for cdp)"
        )
        raise ConfigError(
            f"adversary applies to decor (its SecLDP threat models); {cfg.algorithm} is "
            f"accounted against {own}"
        )
    if cfg.algorithm in ("dsgd", "porter-gc"):
        given = [k for k in ("epsilon", "delta") if values.get(k) is not None]
        if given:
            raise ConfigError(
                f"{cfg.algorithm} is non-private: drop {' and '.join(given)} (ldp, decor, cdp, "
                "porter-dp, privsgp and privsgp-vr take a privacy target)"
            )
    if cfg.algorithm in PRIVSGP:
        given = [k for k in ("batch_size", "sampling") if k in values and values[k] != default[k]]
        if given:
            raise ConfigError(
                f"{cfg.algorithm} draws one table entry of block_size samples per node and step "
                f"(Algorithm 1): drop {', '.join(given)}, or set block_size"
            )
    # (runs saved before this check recorded the then-default "metropolis" for expo: resumable)
    if values.get("mixing") not in (None, "metropolis") and _time_varying(cfg.graph):
        raise ConfigError(f"graph {cfg.graph!r} has its own push-sum weights: drop mixing")
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
    if _time_varying(cfg.graph) and not privsgp:
        raise ConfigError(
            f"graph {cfg.graph!r} is time-varying and directed (push-sum): only privsgp and "
            "privsgp-vr run on it"
        )
    if cfg.algorithm == "porter-gc" and cfg.clip_mode == "per_sample":
        raise ConfigError("porter-gc clips the minibatch mean: use clip_mode batch_mean")
    if cfg.algorithm == "porter-dp" and cfg.clip_mode == "batch_mean":
        raise ConfigError(
            "porter-dp clips each sample's gradient (Algorithm 1, option I): use clip_mode "
            "per_sample, or porter-gc for a clipped minibatch mean"
        )
    if privsgp and cfg.clip_mode == "batch_mean":
        raise ConfigError(f"{cfg.algorithm} clips per sample: use clip_mode per_sample")
    updates: dict[str, Any] = {}
    if cfg.mixing is None and not _time_varying(cfg.graph):
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


#: Options a federated run sets itself (a server instead of a graph, Poisson local batches).
FEDERATED_GRAPH = "server"
_FEDERATED_ONLY = ("clients", "budgets", "clients_per_round", "reestimate_every")


def _refuse_federated_options(cfg: RunConfig) -> None:
    default = {k: f.default for k, f in RunConfig.model_fields.items()}
    used = [k for k in (*_FEDERATED_ONLY, "local_epochs") if getattr(cfg, k) != default[k]]
    if used:
        raise ConfigError(
            f"{', '.join(used)} applies to the federated algorithms ({', '.join(FEDERATED)}), "
            f"not {cfg.algorithm!r}"
        )


def federated_clients(cfg: RunConfig) -> tuple[int, list[float] | None, list[int]]:
    """A federated run's clients: their number, each one's epsilon (None: non-private FedAvg)
    and each one's expected batch size. ``budgets="DistK"`` is the Robust-HDP paper's list K
    (20 clients, Table 12) with the paper's batch sizes; a comma list gives one epsilon per
    client (one value: every client); ``epsilon`` alone gives every client that budget."""
    from privdl.robust.table3 import BATCH_SIZES_20, EPS_LISTS_20

    spec = (cfg.budgets or "").strip()
    dist = {k.lower(): k for k in EPS_LISTS_20}.get(spec.lower())
    if dist is not None:
        n = cfg.clients or len(EPS_LISTS_20[dist])
        if n != len(EPS_LISTS_20[dist]):
            raise ConfigError(
                f"budgets {dist} is the paper's list of {len(EPS_LISTS_20[dist])} clients; "
                f"got clients={n}"
            )
        return n, [float(e) for e in EPS_LISTS_20[dist]], [int(b) for b in BATCH_SIZES_20]
    eps: list[float] | None = None
    if spec:
        try:
            eps = [float(v) for v in spec.split(",")]
        except ValueError:
            eps = []
        if not eps or not all(math.isfinite(e) and e > 0 for e in eps):
            raise ConfigError(
                f"budgets {spec!r}: expected Dist1..Dist9 or a comma list of positive epsilons"
            )
    elif cfg.epsilon is not None:
        eps = [float(cfg.epsilon)]
    n = cfg.clients or (len(eps) if eps is not None and len(eps) > 1 else 20)
    if eps is not None and len(eps) == 1:
        eps = eps * n
    if eps is not None and len(eps) != n:
        raise ConfigError(f"budgets gives {len(eps)} epsilons for {n} clients")
    return n, eps, [cfg.batch_size] * n


def _resolve_federated(cfg: RunConfig, values: dict[str, Any]) -> RunConfig:
    """Check a federated run's options and fill in what it sets itself (see FEDERATED)."""
    alg = cfg.algorithm
    if cfg.task == "least-squares":
        raise ConfigError(f"{alg} trains a model on a dataset: pick a supervised task")
    default = {k: f.default for k, f in RunConfig.model_fields.items()}
    foreign = {
        "graph": "clients talk to a server: give --clients N",
        "mixing": "the server weights the updates itself",
        "sigma": "each client's noise is calibrated to its epsilon: give --epsilon or budgets",
        "sigma_cor": "there is no correlated noise",
        "lr_decay": "the local step size is constant (Eq. 1)",
        "weight_decay": "Eq. 1 has none",
        "noise_backend": "client noise comes from the run's torch generator",
        "clip_kind": "clipping is hard per-sample clipping (Eq. 1)",  # hard is accepted
        "sampling": "local batches are Poisson samples (what the accountant assumes)",
        "gamma": "it is PORTER's consensus step",
        "block_size": "it is PrivSGP-VR's SAGA block",
        "compressor": "updates are sent uncompressed",
    }
    resolved = {"graph": FEDERATED_GRAPH, "sampling": "poisson", "clip_kind": "hard"}
    for key, why in foreign.items():
        # a value given must be the one the run uses: the one it sets itself (so an explicit
        # sampling=without_replacement, the default elsewhere, is refused too), else the default
        if key in resolved:
            foreign_value = key in values and values[key] != resolved[key]
        else:
            foreign_value = values.get(key, default[key]) != default[key]
        if foreign_value:
            raise ConfigError(f"{key} does not apply to {alg} ({why})")
    if cfg.clip_mode == "batch_mean":
        raise ConfigError(f"{alg} clips per sample: use clip_mode per_sample")
    if cfg.reestimate_every is not None and alg != "robust-hdp":
        raise ConfigError(f"reestimate_every is Robust-HDP's, not {alg}'s")
    if cfg.budgets and cfg.epsilon is not None:
        raise ConfigError("give either budgets (one epsilon per client) or epsilon, not both")
    n, eps, batch_sizes = federated_clients(cfg)
    given_b = values.get("batch_size", default["batch_size"])
    if given_b != default["batch_size"] and batch_sizes != [cfg.batch_size] * n:
        raise ConfigError(
            f"budgets {cfg.budgets} comes with the paper's batch sizes: drop batch_size"
        )
    if alg == "fedavg":
        if eps is not None or cfg.clip is not None:
            raise ConfigError("fedavg is non-private: drop epsilon, budgets and clip")
    else:
        if eps is None:
            raise ConfigError(
                f"{alg} needs each client's budget: --budgets E1,E2,... (or Dist1..Dist9), "
                "or --epsilon E for every client"
            )
        if cfg.clip is None:
            raise ConfigError(f"{alg} needs a clipping threshold (--clip C; the paper uses 3)")
    if cfg.clients_per_round is not None and cfg.clients_per_round > n:
        raise ConfigError(f"clients_per_round={cfg.clients_per_round} exceeds the {n} clients")
    if alg == "robust-hdp" and min(n, cfg.clients_per_round or n) < 2:
        raise ConfigError(
            "robust-hdp estimates each client's noise from the others' updates: it needs at "
            "least 2 clients in every round (clients and clients_per_round >= 2)"
        )
    return cfg.model_copy(update={**resolved, "clients": n, "mixing": None})


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
