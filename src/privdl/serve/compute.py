"""The numbers of ``privdl serve``: the CLI's accounting functions, as JSON-ready dicts.

One code path: ``privdl account decor|dpsgd`` and ``privdl calibrate decor|dpsgd`` build their
``--json`` objects with :func:`decor_json`, :func:`dpsgd_json`, :func:`calibrate_decor_json` and
:func:`calibrate_dpsgd_json`, and the web page gets the very same objects. The rest of the module
reads the page's form fields (:func:`number`, :func:`choice`), refuses absurd sizes before any
work (:func:`check_graph_size`, :data:`LIMITS`) and adds what only the page shows: the graph's
facts and drawing, epsilon for every threat model, epsilon over the steps, the nominal plans.
"""

from __future__ import annotations

import math
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from privdl.accounting import (
    account_decor,
    calibrate_noise_multiplier,
    calibrate_sigma_cor,
    dpsgd_budget,
    porter_plan,
    privsgp_plan,
    robust_hdp_plan,
)
from privdl.accounting.compare import compare_decor, compare_event, decor_curves, privacy_curves
from privdl.accounting.conversion import check_delta
from privdl.accounting.decor import DecorAccount
from privdl.accounting.events import SubsampledGaussianEvent
from privdl.accounting.secrdp import MAX_SUBSETS, SecRdpStep, parse_adversary
from privdl.accounting.tightest import EVENT_ACCOUNTANTS
from privdl.errors import ConfigError, GraphError, PrivacyError
from privdl.topology import Topology, parse_graph

#: What the page refuses before any work (the CLI's own limits where it has them: the colluding
#: sets of Alg 3 are capped at its ``--max-subsets`` default and ``--force`` is not offered).
LIMITS: dict[str, int] = {
    "nodes": 2000,  # the dense SecRDP path's limit (secrdp.DENSE_LIMIT): seconds, not hours
    "edges": 200_000,
    "draw_nodes": 300,  # a drawing of more nodes is no longer readable
    "steps": 1_000_000,
    "upload_bytes": 2_000_000,
    "max_subsets": MAX_SUBSETS,
    "curve_points": 12,  # epsilon-vs-steps points of an exact (unsampled) mechanism
    "curve_points_sampled": 6,  # ... of a subsampled one (each point is a PLD composition)
}

#: The threat models the page accounts side by side (collusion:Q added when Q >= 2 is asked).
THREAT_MODELS = ("eavesdropper", "curious", "ldp")


class Cancelled(Exception):
    """The page cancelled the job (raised between two stages)."""


#: progress(fraction in [0, 1], what is being computed); raises :class:`Cancelled` when asked.
Progress = Callable[[float, str], None]


def _no_progress(fraction: float, what: str) -> None:
    return None


# --------------------------------------------------------------------------- shared with the CLI
def run_with_warnings(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``fn()`` and the messages of the warnings it raised (privacy weaker than asked, ...)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught]


def check_positive(name: str, value: float | None, *, allow_zero: bool = False) -> None:
    """Refuse a value that is not finite and > 0 (>= 0 with ``allow_zero``)."""
    if value is None:
        return
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        bound = ">= 0" if allow_zero else "> 0"
        raise PrivacyError(f"{name} must be {bound}, got {value}")


def decor_json(
    graph: Any, graph_spec: str, *, conversion: str | None = None, bound: bool = False,
    step: SecRdpStep | None = None, **settings: Any,
) -> tuple[DecorAccount, dict[str, Any], list[str]]:  # fmt: skip
    """``privdl account decor --json``'s object (without --compare/--curve), its account and its
    warnings; ``settings`` are :func:`~privdl.accounting.decor.account_decor`'s."""
    result, warns = run_with_warnings(
        lambda: account_decor(graph, conversion=conversion, with_bound=bound, step=step, **settings)
    )
    out = {**result.to_dict(), "graph": graph_spec, "warnings": warns}
    if result.budget.mu is not None:
        out["mu"] = result.budget.mu
    return result, out, warns


def dpsgd_json(
    *, noise_multiplier: float, sampling_rate: float, steps: int, delta: float,
    accountant: str = "tightest", sampling: str = "poisson", neighbouring: str = "add_remove",
    dataset_size: int | None = None, threat_model: str = "server",
) -> tuple[dict[str, Any], SubsampledGaussianEvent]:  # fmt: skip
    """``privdl account dpsgd --json``'s object (without --compare/--curve) and its event."""
    budget = dpsgd_budget(
        noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, steps=steps, delta=delta,
        accountant=accountant, sampling=sampling, neighbouring=neighbouring,
        dataset_size=dataset_size, threat_model=threat_model,
    )  # fmt: skip
    out = {
        **budget.to_dict(),
        "noise_multiplier": noise_multiplier,
        "sampling_rate": sampling_rate,
        "steps": steps,
        "label": budget.label(),
    }
    event = SubsampledGaussianEvent(
        noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, steps=steps,
        sampling=sampling, neighbouring=neighbouring, dataset_size=dataset_size,
    )  # fmt: skip
    return out, event


def calibrate_decor_json(
    graph: Any, graph_spec: str, **settings: Any
) -> tuple[dict[str, Any], list[str]]:
    """``privdl calibrate decor --json``'s object and its warnings; ``settings`` are
    :func:`~privdl.accounting.calibration.calibrate_sigma_cor`'s."""
    result, warns = run_with_warnings(lambda: calibrate_sigma_cor(graph, **settings))
    rule = "given" if settings.get("sigma_cdp") is not None else "default: sqrt(2) x sigma_cdp_min"
    if settings.get("sigma_cdp") is None and result.sigma_cdp >= result.sigma_cdp_max:
        rule += ", capped at the LDP level sigma_cdp_max"
    out = {**result.to_dict(), "sigma_cdp_rule": rule, "graph": graph_spec, "warnings": warns}
    if result.budget.mu is not None:
        out["mu"] = result.budget.mu
    return out, warns


def calibrate_dpsgd_json(
    *, epsilon: float, accountant: str = "tightest", threat_model: str = "server", **event: Any
) -> dict[str, Any]:
    """``privdl calibrate dpsgd --json``'s object; ``event`` holds sampling_rate, steps, delta,
    sampling, neighbouring and dataset_size."""
    z = calibrate_noise_multiplier(target_epsilon=epsilon, accountant=accountant, **event)
    budget = dpsgd_budget(noise_multiplier=z, threat_model=threat_model, **event)
    return {
        "noise_multiplier": z,
        "epsilon_target": epsilon,
        "epsilon_achieved": budget.epsilon,
        "delta": event["delta"],
        "calibrated_with": accountant,
        "accountant": budget.accountant,
        "mu": budget.mu,
        "label": budget.label(),
        "budget": budget.to_dict(),
    }


# --------------------------------------------------------------------------- the page's fields
def number(
    params: dict[str, Any], name: str, *, default: Any = ..., integer: bool = False,
    low: float | None = None, high: float | None = None, low_open: bool = False,
) -> Any:  # fmt: skip
    """The field ``name`` as a finite float (an int with ``integer``), within [low, high]
    (``low_open``: > low); a missing or empty field takes ``default`` (required without one)."""
    raw = params.get(name)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        if default is ...:
            raise ConfigError(f"{name}: a value is required")
        return default
    if isinstance(raw, bool):
        raise ConfigError(f"{name}: expected a number, got {raw!r}")
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a number, got {str(raw)[:40]!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{name}: expected a finite number, got {str(raw)[:40]!r}")
    if integer:
        if value != int(value):
            raise ConfigError(f"{name}: expected an integer, got {str(raw)[:40]!r}")
        value = int(value)
    if low is not None and (value <= low if low_open else value < low):
        raise ConfigError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value}")
    if high is not None and value > high:
        raise ConfigError(f"{name} must be <= {high:g}, got {value}")
    return value


def choice(params: dict[str, Any], name: str, options: tuple[str, ...] | list[str],
           default: str | None = None) -> str:  # fmt: skip
    """The field ``name``, one of ``options``."""
    raw = params.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ConfigError(f"{name}: a value is required")
        return default
    if raw not in options:
        raise ConfigError(f"{name}: expected one of {', '.join(options)}, got {str(raw)[:40]!r}")
    return str(raw)


def delta_field(params: dict[str, Any]) -> float:
    """The target delta, in (0, 1) (the accountants' own check)."""
    delta = number(params, "delta")
    check_delta(delta)
    return float(delta)


def steps_field(params: dict[str, Any], name: str = "steps") -> int:
    return int(number(params, name, integer=True, low=1, high=LIMITS["steps"]))


# --------------------------------------------------------------------------- graphs
def spec_size(spec: str) -> tuple[int, int] | None:
    """(nodes, edges, an upper estimate) a graph spec names, read off the string without building
    the graph; None for what is not a sized spec (an edge-list file, a typo: parse_graph says)."""
    kind, _, rest = spec.strip().partition(":")
    parts = rest.split(":")
    try:
        if kind in ("ring", "path", "star", "complete"):
            n = int(parts[0])
            return n, n * (n - 1) // 2 if kind == "complete" else n
        if kind in ("torus", "grid"):
            r, _, c = parts[0].partition("x")
            n = int(r) * int(c)
            return n, 2 * n
        if kind == "regular":
            n, d = int(parts[0]), int(parts[1])
            return n, n * d // 2
        if kind == "er":
            n, p = int(parts[0]), float(parts[1])
            return n, int(min(max(p, 0.0), 1.0) * n * (n - 1) / 2)
    except (ValueError, IndexError):
        return None
    return None


def check_graph_size(nodes: int, edges: int, what: str) -> None:
    """Refuse a graph over :data:`LIMITS` (before it is built where the size is known)."""
    if nodes > LIMITS["nodes"]:
        raise ConfigError(
            f"{what} has {nodes:,} nodes; this page accounts graphs of at most "
            f"{LIMITS['nodes']:,} nodes (use the privdl CLI for larger ones)"
        )
    if edges > LIMITS["edges"]:
        raise ConfigError(
            f"{what} has {edges:,} edges; this page takes at most {LIMITS['edges']:,} edges"
        )


def graph_from_spec(spec: str) -> Topology:
    """A spec string (not a file: the page uploads edge lists) as a :class:`Topology`."""
    spec = spec.strip()
    size = spec_size(spec)
    if size is None:
        kind = spec.partition(":")[0]
        if kind not in ("ring", "path", "star", "complete", "torus", "grid", "er", "regular"):
            raise GraphError(
                f"unknown graph spec {spec[:60]!r}; expected ring:N, path:N, star:N, complete:N, "
                "torus:RxC, grid:RxC, er:N:P:SEED or regular:N:D:SEED (or upload an edge list)"
            )
    else:
        check_graph_size(*size, what=f"graph {spec!r}")
    return parse_graph(spec)  # the CLI's parser and its messages


def graph_from_edge_list(text: str, filename: str = "edges.txt") -> Topology:
    """An uploaded edge list, read by the CLI's reader (the same checks and messages, the file
    named by its own name, not the temporary copy's path)."""
    safe = "".join(c for c in Path(filename).name if c.isalnum() or c in "._-")[:60] or "edges.txt"
    with tempfile.TemporaryDirectory(prefix="privdl-serve-") as tmp:
        path = Path(tmp) / safe
        path.write_text(text)
        try:
            topo = parse_graph(str(path))
        except GraphError as exc:
            raise GraphError(str(exc).replace(f"{tmp}/", "")) from None
    topo = Topology(name=safe, graph=topo.graph)  # named by the file, not the temporary copy
    check_graph_size(topo.n, topo.num_edges, what=f"edge list {safe!r}")
    return topo


def graph_facts(topo: Topology) -> dict[str, Any]:
    """``privdl graph --json``'s facts, the degrees and, for a small graph, a drawing (node
    positions in [0, 1]^2 and the edges)."""
    from privdl.cli.graph import topology_facts

    info = topology_facts(topo, "metropolis")
    deg = topo.degrees
    values, counts = np.unique(deg, return_counts=True)
    info["degree_histogram"] = {str(int(v)): int(c) for v, c in zip(values, counts, strict=True)}
    info["drawing"] = drawing(topo) if topo.n <= LIMITS["draw_nodes"] else None
    return info


def drawing(topo: Topology) -> dict[str, Any]:
    """Node positions in [0, 1]^2 and the edges: a circle for rings and complete graphs, the
    lattice for grids, rows as concentric circles for tori, else a spring layout (seed 0)."""
    import networkx as nx

    kind, _, rest = topo.name.partition(":")
    idx = np.arange(topo.n)
    if kind in ("torus", "grid") and "x" in rest:
        rows, cols = (int(v) for v in rest.split("x"))
        r, c = idx // cols, idx % cols
        if kind == "grid":
            xy = np.c_[c, r].astype(float)
        else:  # the column index wraps round a circle, the row index goes outwards
            radius = 0.35 + 0.65 * (r + 1) / rows
            xy = np.c_[radius * np.cos(2 * np.pi * c / cols), radius * np.sin(2 * np.pi * c / cols)]
    elif kind in ("ring", "complete") or topo.n <= 3:
        xy = np.c_[np.cos(2 * np.pi * idx / topo.n), np.sin(2 * np.pi * idx / topo.n)]
    else:
        pos = nx.spring_layout(topo.graph, seed=0, iterations=100)
        xy = np.array([pos[i] for i in range(topo.n)], dtype=float).reshape(topo.n, 2)
    lo, span = xy.min(axis=0), np.ptp(xy, axis=0)
    xy = (xy - lo) / np.where(span > 0, span, 1.0)
    return {"xy": np.round(xy, 4).tolist(), "edges": topo.edges.tolist()}


# --------------------------------------------------------------------------- page computations
def step_grid(steps: int, points: int | None = None) -> list[int]:
    """About ``points`` step counts from 1 to ``steps``, log-spaced, ``steps`` included."""
    points = points or LIMITS["curve_points"]
    grid = np.unique(np.round(np.geomspace(1, steps, min(points, steps))).astype(int))
    return [int(t) for t in grid]


def decor_settings(params: dict[str, Any]) -> dict[str, Any]:
    """The page's DECOR fields as :func:`decor_json`'s keyword arguments (checked like the
    CLI's options), the adversary asked included."""
    sigma_cdp = number(params, "sigma_cdp")
    check_positive("sigma_cdp", sigma_cdp)
    sigma_cor = number(params, "sigma_cor")
    check_positive("sigma_cor", sigma_cor, allow_zero=True)
    clip = number(params, "clip", default=1.0)
    check_positive("clip", clip)
    settings: dict[str, Any] = dict(
        sigma_cdp=sigma_cdp, sigma_cor=sigma_cor, clip=clip, steps=steps_field(params),
        delta=delta_field(params), adversary=adversary_field(params),
        max_subsets=LIMITS["max_subsets"], force=False,
    )  # fmt: skip
    unit = choice(params, "unit", ("user", "example"), "user")
    conversion = params.get("conversion") or None
    if unit == "example":
        settings["sampling_rate"] = number(params, "sampling_rate", low=0, low_open=True, high=1)
        settings["batch_size"] = number(params, "batch_size", integer=True, low=1)
        settings["sampling"] = choice(params, "sampling", ("fixed_size", "poisson"), "fixed_size")
        settings["neighbouring"] = choice(
            params, "neighbouring", ("replace_one", "add_remove"), "replace_one"
        )
    settings["conversion"] = conversion
    return settings


def adversary_field(params: dict[str, Any]) -> str:
    """eavesdropper | curious | ldp | collusion (with ``q``) as the CLI's ``--adversary``."""
    adv = choice(params, "adversary", ("eavesdropper", "curious", "collusion", "ldp"),
                 "eavesdropper")  # fmt: skip
    if adv != "collusion":
        return adv
    q = number(params, "q", integer=True, low=0)
    return parse_adversary(f"collusion:{q}").label


def decor_page(topo: Topology, graph_spec: str, params: dict[str, Any],
               progress: Progress = _no_progress) -> dict[str, Any]:  # fmt: skip
    """Everything the DECOR panel shows: the CLI's object for the adversary asked (with its
    accountants side by side and its curves), epsilon for every threat model, and epsilon over
    the steps for each."""
    settings = decor_settings(params)
    topo.require_connected("DECOR accounting")  # the CLI's refusal and message
    asked = settings.pop("adversary")
    conversion = settings.pop("conversion")
    threats = list(dict.fromkeys([asked, *THREAT_MODELS]))  # the one asked first
    # a subsampled step's curve costs a PLD composition per point: only the asked threat model's
    sampled = "sampling_rate" in settings and settings["sampling_rate"] < 1
    grid = step_grid(settings["steps"], LIMITS["curve_points_sampled"] if sampled else None)
    curve_threats = [asked] if sampled else threats
    stages = len(threats) + len(curve_threats) + 2
    models: dict[str, Any] = {}
    accounts: dict[str, DecorAccount] = {}
    out: dict[str, Any] = {}
    for k, threat in enumerate(threats):
        alg = 2 if threat in ("eavesdropper", "ldp") else 3
        progress(k / stages, f"SecRDP step against {threat} (Alg {alg})")
        try:
            acc, obj, _ = decor_json(topo.graph, graph_spec, conversion=conversion,
                                     adversary=threat, **settings)  # fmt: skip
        except PrivacyError as exc:
            if threat == asked:
                raise
            # another threat model that does not apply here (e.g. q >= n): said, not fatal
            models[threat] = {"epsilon": None, "label": f"not applicable: {exc}"}
            continue
        accounts[threat] = acc
        models[threat] = {"epsilon": obj["epsilon"], "label": obj["label"], "mu": obj.get("mu"),
                          "step_rdp": obj["step_rdp"], "warnings": obj["warnings"]}  # fmt: skip
        if threat == asked:
            out = obj
    curve_threats = [t for t in curve_threats if t in accounts]
    for k, threat in enumerate(curve_threats):
        step = step_of(accounts[threat])
        eps = []
        for j, t in enumerate(grid):
            progress((len(threats) + k + j / len(grid)) / stages,
                     f"epsilon after {t} of {settings['steps']} steps ({threat})")  # fmt: skip
            if t == settings["steps"]:  # the call made above, with these very arguments
                eps.append(models[threat]["epsilon"])
                continue
            account, _, _ = decor_json(topo.graph, graph_spec, conversion=conversion,
                                    adversary=threat, step=step, **{**settings, "steps": t})  # fmt: skip
            eps.append(account.epsilon)
        models[threat]["curve"] = {"steps": grid, "epsilons": eps}
    progress((stages - 2) / stages, "every accountant side by side")
    step = step_of(accounts[asked])
    rows, _ = run_with_warnings(
        lambda: compare_decor(topo.graph, adversary=asked, step=step, **settings)
    )
    out["compare"] = rows
    progress((stages - 1) / stages, "(epsilon, delta) and trade-off curves")
    out["curves"] = decor_curves(accounts[asked])
    out["threat_models"] = models
    return out


def step_of(account: DecorAccount) -> SecRdpStep:
    """The per-step SecRDP an account was computed from (reused for other step counts)."""
    return SecRdpStep(account.step_rdp, parse_adversary(account.adversary).q, account.adversary,
                      account.method, account.worst_colluders, account.worst_node,
                      account.disconnected)  # fmt: skip


def dpsgd_settings(params: dict[str, Any]) -> dict[str, Any]:
    """The page's DP-SGD fields as :func:`dpsgd_json`'s keyword arguments."""
    sampling = choice(params, "sampling", ("poisson", "fixed_size", "none"), "poisson")
    return dict(
        sampling_rate=number(params, "sampling_rate", low=0, low_open=True, high=1),
        steps=steps_field(params),
        delta=delta_field(params),
        accountant=choice(params, "accountant", tuple(EVENT_ACCOUNTANTS), "tightest"),
        sampling=sampling,
        neighbouring=choice(params, "neighbouring", ("add_remove", "replace_one"), "add_remove"),
        dataset_size=number(params, "dataset_size", integer=True, low=1, default=None),
        threat_model=choice(params, "threat_model", ("server", "ldp", "central"), "server"),
    )


def dpsgd_page(params: dict[str, Any], progress: Progress = _no_progress) -> dict[str, Any]:
    """The DP-SGD panel: the CLI's object, every accountant side by side, the curves and epsilon
    over the steps."""
    settings = dpsgd_settings(params)
    z = number(params, "noise_multiplier", low=0, low_open=True)
    progress(0.0, "DP-SGD epsilon")
    out, event = dpsgd_json(noise_multiplier=z, **settings)
    progress(0.2, "every accountant side by side")
    out["compare"] = compare_event(event, delta=settings["delta"])
    progress(0.4, "(epsilon, delta) and trade-off curves")
    out["curves"] = privacy_curves(event)
    sampled = settings["sampling"] != "none" and settings["sampling_rate"] < 1
    grid = step_grid(settings["steps"], LIMITS["curve_points_sampled"] if sampled else None)
    eps = []
    for k, t in enumerate(grid):
        progress(0.6 + 0.4 * k / len(grid), f"epsilon after {t} steps")
        if t == settings["steps"]:  # the call made above, with these very arguments
            eps.append(out["epsilon"])
            continue
        eps.append(dpsgd_json(noise_multiplier=z, **{**settings, "steps": t})[0]["epsilon"])
    out["curve_steps"] = {"steps": grid, "epsilons": eps}
    return out


def calibrate_decor_page(topo: Topology, graph_spec: str, params: dict[str, Any],
                         progress: Progress = _no_progress) -> dict[str, Any]:  # fmt: skip
    """``privdl calibrate decor``: the smallest sigma_cor for a target epsilon."""
    epsilon = number(params, "epsilon")
    check_positive("epsilon", epsilon)
    clip = number(params, "clip", default=1.0)
    check_positive("clip", clip)
    sigma_cdp = number(params, "sigma_cdp", default=None)
    check_positive("sigma_cdp", sigma_cdp)
    conversion = choice(params, "conversion", ("gaussian", "classic", "improved"), "gaussian")
    settings = dict(epsilon=epsilon, delta=delta_field(params), steps=steps_field(params),
                    clip=clip, sigma_cdp=sigma_cdp, adversary=adversary_field(params),
                    conversion=conversion, max_subsets=LIMITS["max_subsets"], force=False)  # fmt: skip
    topo.require_connected("DECOR accounting")
    progress(0.0, "bisection on sigma_cor")
    out, _ = calibrate_decor_json(topo.graph, graph_spec, **settings)
    return out


def calibrate_dpsgd_page(params: dict[str, Any],
                         progress: Progress = _no_progress) -> dict[str, Any]:  # fmt: skip
    """``privdl calibrate dpsgd``: the smallest noise multiplier for a target epsilon."""
    epsilon = number(params, "epsilon")
    check_positive("epsilon", epsilon)
    settings = dpsgd_settings(params)
    progress(0.0, "bisection on the noise multiplier")
    return calibrate_dpsgd_json(epsilon=epsilon, **settings)


#: The nominal plans: name -> (builder, its fields: page name -> (keyword, kind)).
PLANS: dict[str, tuple[Callable[..., Any], dict[str, tuple[str, str]]]] = {
    "privsgp": (privsgp_plan, {"gradient_bound": ("gradient_bound", "float"),
                               "steps": ("steps", "int"), "local_samples": ("local_samples", "int"),
                               "epsilon": ("epsilon", "float"), "delta": ("delta", "float"),
                               "c2": ("c2", "float?")}),
    "porter": (porter_plan, {"tau": ("tau", "float"), "steps": ("steps", "int"),
                             "local_samples": ("local_samples", "int"),
                             "epsilon": ("epsilon", "float"), "delta": ("delta", "float"),
                             "c": ("c", "float?")}),
    "robust-hdp": (robust_hdp_plan, {"epsilon": ("epsilon", "float"), "delta": ("delta", "float"),
                                     "batch_size": ("batch_size", "int"),
                                     "dataset_size": ("dataset_size", "int"),
                                     "local_epochs": ("local_epochs", "int"),
                                     "rounds": ("rounds", "int")}),
}  # fmt: skip


def plan_page(params: dict[str, Any], progress: Progress = _no_progress) -> dict[str, Any]:
    """A paper's nominal noise formula and the epsilon it really gives (``privdl plan``)."""
    name = choice(params, "plan", tuple(PLANS), "privsgp")
    builder, fields = PLANS[name]
    kwargs: dict[str, Any] = {}
    for field, (keyword, kind) in fields.items():
        key = f"plan_{field}"
        if field == "delta":
            kwargs[keyword] = delta_field({"delta": params.get(key)})
        elif field == "steps":
            kwargs[keyword] = steps_field(params, key)
        elif kind == "int":
            kwargs[keyword] = number(params, key, integer=True, low=1)
        elif kind == "float?":
            value = number(params, key, default=None, low=0, low_open=True)
            if value is not None:
                kwargs[keyword] = value
        else:
            kwargs[keyword] = number(params, key, low=0, low_open=True)
    if name == "robust-hdp":
        kwargs["round_to"] = 2  # the CLI's default (the reference code's 2-decimal rounding)
    progress(0.0, f"{name} plan")
    out = builder(**kwargs).to_dict()
    if name == "privsgp":  # what ``privdl plan privsgp --json`` adds
        out["steps"] = kwargs["steps"]
    out["plan"] = name
    return out
