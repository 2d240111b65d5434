"""The registry: one table from algorithm names to recipes, and the configuration they validate.

Every algorithm privdl can run is one entry here (as Opacus's accountant registry): its name, the
recipe instance that configures, calibrates, builds and accounts it (:mod:`privdl.recipes`), and
a line of description. The CLI's choices and options, config files, ``privdl.train`` and
``privdl launch`` all read this table; nothing else names an algorithm.

Adding an algorithm is its module plus one :func:`register` call (a new family also brings its
recipe)::

    import privdl
    privdl.register("my-dsgd", MyRecipe(), description="my variant of D-SGD")

An entry registered outside privdl (a test file, a user's module) is remembered with the file
that registered it, so that processes started by ``privdl launch`` import it too.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from privdl.config import CommonConfig, format_validation_error
from privdl.errors import ConfigError
from privdl.recipes.base import Recipe, resolve_common
from privdl.recipes.federated import FederatedRecipe
from privdl.recipes.gossip import GossipRecipe
from privdl.recipes.porter import PorterRecipe
from privdl.recipes.privsgp import PrivSGPRecipe

__all__ = [
    "Entry",
    "algorithms",
    "config_fields",
    "get_entry",
    "list_algorithms",
    "make_config",
    "plugin_files",
    "recipe_for",
    "register",
    "unregister",
]

#: The entry-point group a package registers its algorithms under (loaded on first lookup).
ENTRY_POINT_GROUP = "privdl.algorithms"
#: The algorithm of a configuration that names none (non-private D-SGD).
DEFAULT_ALGORITHM = "dsgd"


@dataclass(frozen=True)
class Entry:
    """One registered algorithm."""

    name: str
    recipe: Recipe
    description: str = ""
    #: the file that registered it, when not privdl itself (imported by launched processes)
    origin: str | None = None


_ENTRIES: dict[str, Entry] = {}
_PLUGINS_LOADED = False


def register(name: str, recipe: Recipe, *, description: str = "", replace: bool = False) -> Entry:
    """Make ``name`` an algorithm that ``recipe`` runs. Refuses a name taken by another recipe
    unless ``replace``."""
    if not name or name != name.strip() or any(c.isspace() for c in name):
        raise ConfigError(f"algorithm names are non-empty words, got {name!r}")
    if not isinstance(recipe, Recipe):
        raise ConfigError(f"register({name!r}, ...) needs a privdl.recipes.Recipe instance")
    origin = _caller_file()
    old = _ENTRIES.get(name)
    same_source = old is not None and (old.recipe is recipe or old.origin == origin)
    if old is not None and not replace and not same_source:
        raise ConfigError(f"algorithm {name!r} is registered already (replace=True to replace)")
    entry = Entry(name, recipe, description, origin)
    _ENTRIES[name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove ``name`` (for tests and plugins that clean up after themselves)."""
    _ENTRIES.pop(name, None)


def _caller_file() -> str | None:
    """The file of the code that called :func:`register`, unless it is privdl's own."""
    frame = sys._getframe(2)
    path = frame.f_globals.get("__file__")
    module = str(frame.f_globals.get("__name__", ""))
    if path is None or module == "privdl" or module.startswith("privdl."):
        return None
    return str(path)


def _load_plugins() -> None:
    """Packages that declare ``[project.entry-points."privdl.algorithms"]`` register theirs."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()


def algorithms() -> dict[str, Entry]:
    """Every registered algorithm, by name (built-ins first, in the order registered)."""
    _load_plugins()
    return dict(_ENTRIES)


def list_algorithms() -> dict[str, Entry]:
    """Every registered algorithm, by name (``privdl.list_algorithms()``; ``privdl algorithms``
    on the command line)."""
    return algorithms()


def get_entry(name: str) -> Entry:
    """The entry of ``name``; a one-line error listing the known names otherwise."""
    entries = algorithms()
    if name not in entries:
        raise ConfigError(f"unknown algorithm {name!r}; choose one of: {', '.join(entries)}")
    return entries[name]


def recipe_for(cfg: Any) -> Recipe:
    """The recipe that runs ``cfg`` (a config or a mapping with ``algorithm``)."""
    name = cfg.get("algorithm", DEFAULT_ALGORITHM) if isinstance(cfg, Mapping) else cfg.algorithm
    return get_entry(str(name)).recipe


def plugin_files() -> list[str]:
    """Files that registered algorithms from outside privdl (launched processes import them)."""
    return sorted({e.origin for e in algorithms().values() if e.origin is not None})


def config_fields() -> dict[str, Any]:
    """Every option any registered algorithm takes (the union of their models' fields), in the
    order of their first appearance: what the CLI offers and ``--set`` accepts."""
    out: dict[str, Any] = {}
    for entry in algorithms().values():
        for key, field in entry.recipe.config_model.model_fields.items():
            out.setdefault(key, field)
    return out


def _owners(key: str) -> str:
    """Who takes option ``key``: a family's label, or the algorithms' names."""
    names = [n for n, e in algorithms().items() if key in e.recipe.config_model.model_fields]
    families = {type(algorithms()[n].recipe).family for n in names}
    if len(families) == 1 and (label := families.pop()):
        return f"{label} ({', '.join(names)})"
    return ", ".join(names)


def make_config(values: Mapping[str, Any], *, saved: bool = False) -> CommonConfig:
    """Validate a mapping into the configuration of its algorithm's family (one-line errors).

    ``saved``: a run's own ``config.json``, possibly written by an earlier privdl whose one
    flat model held every family's keys: keys this family does not take are dropped (they held
    that model's defaults or values it resolved itself).
    """
    values = dict(values)
    name = values.get("algorithm", DEFAULT_ALGORITHM)
    if not isinstance(name, str):
        raise ConfigError(f"invalid config value for 'algorithm': {name!r} is not a name")
    entry = get_entry(name)
    recipe = entry.recipe
    model = recipe.config_model
    known = set(config_fields())
    if saved and "accountant" not in values and "accountant" in model.model_fields:
        values["accountant"] = "rdp"  # a run saved before the choice existed: keep its accounting
    for key in list(values):
        if key in model.model_fields:
            continue
        if saved:
            values.pop(key)
        elif key in known:
            raise ConfigError(recipe.foreign(key, name, _owners(key)))
    values["algorithm"] = name
    try:
        cfg = model(**values)
    except ValidationError as exc:
        raise format_validation_error(exc) from None
    given = {k: v for k, v in values.items() if k != "algorithm"}
    cfg = resolve_common(recipe, cfg, given)
    resolved: CommonConfig = recipe.resolve(cfg, given)
    return resolved


def _builtin() -> None:
    """privdl's own algorithms (DECOR, PORTER, PrivSGP-VR, Robust-HDP and their baselines)."""
    gossip = "noisy gossip (DECOR, Allouah et al. ICML 2024, and its baselines)"
    entries: list[tuple[str, Recipe, str]] = [
        ("dsgd", GossipRecipe(noise=None), f"D-SGD, non-private; {gossip}"),
        ("ldp", GossipRecipe(noise="local"), f"per-node Gaussian noise (LDP); {gossip}"),
        ("decor", GossipRecipe(noise="correlated"), f"DECOR, correlated noise; {gossip}"),
        ("cdp", GossipRecipe(noise="central"), f"exact averaging, central noise; {gossip}"),
        (
            "dpsgd",
            GossipRecipe(noise="central", default_graph="complete:1"),
            "DP-SGD with a trusted aggregator (one node unless --graph; Abadi et al. 2016)",
        ),
        ("porter-dp", PorterRecipe(noise=True), "PORTER-DP, Li & Chi, Algorithm 1 option I"),
        ("porter-gc", PorterRecipe(noise=False), "PORTER-GC, Li & Chi, option II (no noise)"),
        ("privsgp", PrivSGPRecipe(variance_reduction=False), "PrivSGP, Zhu et al. Algorithm 2"),
        (
            "privsgp-vr",
            PrivSGPRecipe(variance_reduction=True),
            "PrivSGP-VR, Zhu et al. IJCAI 2024 Algorithm 1",
        ),
        (
            "robust-hdp",
            FederatedRecipe(aggregator="robust-hdp", estimates_noise=True, min_clients=2),
            "Robust-HDP, Malekmohammadi et al. ICML 2024 Algorithm 1",
        ),
        ("weiavg", FederatedRecipe(aggregator="weiavg"), "WeiAvg (Robust-HDP Table 1 baseline)"),
        ("pfa", FederatedRecipe(aggregator="pfa"), "PFA (Robust-HDP Table 1 baseline)"),
        ("dpfedavg", FederatedRecipe(aggregator="dpfedavg"), "DPFedAvg (Robust-HDP Table 1)"),
        ("mineps", FederatedRecipe(aggregator="mineps"), "minEps (Robust-HDP Table 1 baseline)"),
        (
            "fedavg",
            FederatedRecipe(aggregator="fedavg", private=False),
            "FedAvg, non-private (Robust-HDP Table 12)",
        ),
    ]
    for name, recipe, description in entries:
        register(name, recipe, description=description)


_builtin()
