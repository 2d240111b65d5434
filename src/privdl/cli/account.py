"""``privdl account``, ``privdl calibrate`` and ``privdl plan``: privacy accounting commands.

Every epsilon printed carries its label (accountant, delta, neighbouring, unit, threat model).
``--json`` prints one JSON object; otherwise a short readable table.
"""

from __future__ import annotations

import json
from typing import Any, cast

import click

from privdl.accounting import (
    porter_plan,
    privsgp_optimal_steps,
    privsgp_plan,
    robust_hdp_plan,
)
from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.compare import compare_decor, compare_event, decor_curves, privacy_curves
from privdl.accounting.tightest import EVENT_ACCOUNTANTS
from privdl.cli.account_compare import check_curve_out, compare_options, finish
from privdl.errors import PrivacyError
from privdl.serve.compute import (
    calibrate_decor_json,
    calibrate_dpsgd_json,
    check_positive,
    decor_json,
    dpsgd_json,
    run_with_warnings,
)
from privdl.topology import parse_graph


def _graph(spec: str, *, connected: str | None = None) -> Any:
    """The graph of ``spec``; with ``connected`` (what needs it), a disconnected one is refused
    (a DECOR deployment on it is no deployment: its components never mix, and the accountant's
    answer for it would describe no run privdl makes)."""
    topo = parse_graph(spec)
    if connected is not None:
        topo.require_connected(connected)
    return topo.graph


#: Who the DP-SGD mechanism is private against: it only names the label (the arithmetic is
#: the same); "server" for one trainer's records seen by whoever receives the model/updates,
#: "ldp" for a node whose every message is public (LDP, PORTER, PrivSGP), "central" for a
#: trusted aggregator's output.
_THREAT_MODEL = click.option(
    "--threat-model",
    type=click.Choice(["server", "ldp", "central"]),
    default="server",
    show_default=True,
    help="Threat model written in the label (server: the receiver of the model or updates; "
    "ldp: every message a node sends is public; central: a trusted aggregator's output).",
)


#: DP-SGD's sampling scheme, neighbouring relation and records per node (account, calibrate).
_SAMPLING = click.option(
    "--sampling",
    type=click.Choice(["poisson", "fixed_size", "none"]),
    default="poisson",
    show_default=True,
)
_NEIGHBOURING = click.option(
    "--neighbouring",
    type=click.Choice(["add_remove", "replace_one"]),
    default="add_remove",
    show_default=True,
)
_DATASET_SIZE = click.option(
    "--dataset-size",
    type=click.IntRange(min=1),
    default=None,
    help="Needed for fixed_size sampling.",
)


_ACCOUNTANT = click.option(
    "--accountant",
    type=click.Choice(list(EVENT_ACCOUNTANTS)),
    default="tightest",
    show_default=True,
    help="tightest: the smallest certified epsilon (exact Gaussian when unsampled, else the "
    "smaller of dp-accounting's PLD and RDP); gaussian, pld or rdp: that accountant alone.",
)


def _emit(obj: dict[str, Any], as_json: bool, title: str) -> None:
    if as_json:
        click.echo(json.dumps(obj, default=_json_default, allow_nan=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=True)
    table.add_column("quantity")
    table.add_column("value")
    budget = (
        cast("dict[str, Any]", obj.get("budget")) if isinstance(obj.get("budget"), dict) else {}
    )
    for key, value in obj.items():
        if isinstance(value, dict) or (key == "mu" and value is None):
            continue
        if isinstance(value, float):
            value = f"{value:.6g}"
        if key == "epsilon" and budget.get("nominal"):
            value = f"{value} NOMINAL: not an (epsilon, delta) guarantee"
        table.add_row(str(key), str(value))
    if budget.get("notes"):
        table.add_row("notes", str(budget["notes"]))
    for key in ("nominal", "accounted"):  # a plan's two budgets, each with its full label
        if isinstance(obj.get(key), dict) and "epsilon" in obj[key]:
            b = PrivacyBudget(**obj[key])
            table.add_row(f"{key} (label)", b.label() + (f"; {b.notes}" if b.notes else ""))
    for key, raw in (obj.get("comparisons") or {}).items():  # a plan's side figures, labelled
        b = PrivacyBudget(**raw)
        table.add_row(f"{key} (label)", b.label() + (f"; {b.notes}" if b.notes else ""))
    Console().print(table)


def _json_default(o: Any) -> Any:
    if isinstance(o, tuple):
        return list(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


_positive = check_positive
_run_with_warnings = run_with_warnings


# --------------------------------------------------------------------------- account
@click.group()
def account() -> None:
    """Privacy accounting: what (epsilon, delta) does a deployment give?"""


@account.command("decor")
@click.option("--graph", "graph_spec", required=True, help="ring:16, torus:4x4, ... or edge file.")
@click.option("--sigma-cdp", type=float, required=True, help="Std of the independent noise.")
@click.option("--sigma-cor", type=float, required=True, help="Std of the correlated noise.")
@click.option("--clip", type=float, default=1.0, show_default=True, help="Clipping threshold C.")
@click.option("--steps", type=click.IntRange(min=1), required=True, help="Number of iterations T.")
@click.option("--delta", type=float, required=True)
@click.option(
    "--adversary",
    default="eavesdropper",
    show_default=True,
    help="eavesdropper | curious | collusion:Q | ldp",
)
@click.option(
    "--conversion",
    default=None,
    help="user level: gaussian (default, exact) | classic | improved; example level: "
    "tightest (default) | pld | rdp | classic | legacy-uncomposed",
)
@click.option("--sampling-rate", type=float, default=None, help="Example level: b/m.")
@click.option("--batch-size", type=int, default=None, help="Example level: batch size b.")
@click.option(
    "--sampling",
    type=click.Choice(["fixed_size", "poisson"]),
    default="fixed_size",
    show_default=True,
)
@click.option(
    "--neighbouring",
    type=click.Choice(["replace_one", "add_remove"]),
    default="replace_one",
    show_default=True,
)
@click.option("--bound/--no-bound", default=False, help="Also report the Theorem 1/6 bound.")
@click.option("--max-subsets", type=int, default=100_000, show_default=True)
@click.option("--force", is_flag=True, help="Enumerate more colluding sets than --max-subsets.")
@compare_options
@click.option("--json", "as_json", is_flag=True)
def account_decor_cmd(
    graph_spec: str,
    sigma_cdp: float,
    sigma_cor: float,
    clip: float,
    steps: int,
    delta: float,
    adversary: str,
    conversion: str | None,
    sampling_rate: float | None,
    batch_size: int | None,
    sampling: str,
    neighbouring: str,
    bound: bool,
    max_subsets: int,
    force: bool,
    compare: bool,
    curve: bool,
    curve_out: str | None,
    as_json: bool,
) -> None:
    """(eps, delta)-SecLDP of DECOR (Alg 2/3 + composition + conversion)."""
    _positive("--sigma-cdp", sigma_cdp)
    _positive("--sigma-cor", sigma_cor, allow_zero=True)
    _positive("--clip", clip)
    check_curve_out(curve_out)
    graph = _graph(graph_spec, connected="DECOR accounting")
    settings: dict[str, Any] = dict(
        sigma_cdp=sigma_cdp,
        sigma_cor=sigma_cor,
        clip=clip,
        steps=steps,
        delta=delta,
        adversary=adversary,
        sampling_rate=sampling_rate,
        batch_size=batch_size,
        sampling=sampling,
        neighbouring=neighbouring,
        max_subsets=max_subsets,
        force=force,
    )
    result, out, warns = decor_json(
        graph, graph_spec, conversion=conversion, bound=bound, **settings
    )
    rows = curves = None
    if compare:  # its repeated step computations repeat the warnings above: not shown twice
        rows, _ = _run_with_warnings(lambda: compare_decor(graph, **settings))
    if curve or curve_out:
        curves = decor_curves(result)
    for w in warns:
        click.echo(f"warning: {w}", err=True)
    finish(out, as_json=as_json, emit=_emit, title="DECOR privacy", rows=rows, curves=curves,
           curve_out=curve_out, show_curves=curve)  # fmt: skip


@account.command("dpsgd")
@click.option(
    "--noise-multiplier",
    type=float,
    required=True,
    help="Noise std / the L2 sensitivity under --neighbouring: sigma/C for a clipped sum under "
    "add_remove, sigma/(2C) under replace_one (a replaced record moves the sum by 2C).",
)
@click.option("--sampling-rate", type=float, required=True)
@click.option("--steps", type=click.IntRange(min=1), required=True)
@click.option("--delta", type=float, required=True)
@_ACCOUNTANT
@_SAMPLING
@_NEIGHBOURING
@_DATASET_SIZE
@_THREAT_MODEL
@compare_options
@click.option("--json", "as_json", is_flag=True)
def account_dpsgd_cmd(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    accountant: str,
    sampling: str,
    neighbouring: str,
    dataset_size: int | None,
    threat_model: str,
    compare: bool,
    curve: bool,
    curve_out: str | None,
    as_json: bool,
) -> None:
    """(eps, delta) of DP-SGD: T steps of a subsampled Gaussian, by default the tightest
    certified accountant's (exact Gaussian, dp-accounting's PLD or RDP)."""
    check_curve_out(curve_out)
    out, event = dpsgd_json(
        noise_multiplier=noise_multiplier,
        sampling_rate=sampling_rate,
        steps=steps,
        delta=delta,
        accountant=accountant,
        sampling=sampling,
        neighbouring=neighbouring,
        dataset_size=dataset_size,
        threat_model=threat_model,
    )
    rows = compare_event(event, delta=delta) if compare else None
    curves = privacy_curves(event) if (curve or curve_out) else None
    finish(out, as_json=as_json, emit=_emit, title="DP-SGD privacy", rows=rows, curves=curves,
           curve_out=curve_out, show_curves=curve)  # fmt: skip


# --------------------------------------------------------------------------- calibrate
@click.group()
def calibrate() -> None:
    """Noise calibration: what noise reaches a target (epsilon, delta)?"""


@calibrate.command("decor")
@click.option("--graph", "graph_spec", required=True)
@click.option("--epsilon", type=float, required=True)
@click.option("--delta", type=float, required=True)
@click.option("--steps", type=click.IntRange(min=1), required=True)
@click.option("--clip", type=float, default=1.0, show_default=True)
@click.option(
    "--sigma-cdp",
    type=float,
    default=None,
    help="Std of the independent noise [default: sqrt(2) x its smallest admissible value].",
)
@click.option("--adversary", default="eavesdropper", show_default=True)
@click.option(
    "--conversion",
    type=click.Choice(["classic", "improved", "gaussian"]),
    default="gaussian",
    show_default=True,
    help="gaussian: exact (mu-GDP); classic: Mironov's Lemma 11 (the DECOR paper's); improved: "
    "Canonne-Kamath-Steinke.",
)
@click.option(
    "--rtol", type=click.FloatRange(min=0, max=0.5, min_open=True), default=1e-6, show_default=True
)
@click.option("--max-subsets", type=int, default=100_000, show_default=True)
@click.option("--force", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
def calibrate_decor_cmd(
    graph_spec: str,
    epsilon: float,
    delta: float,
    steps: int,
    clip: float,
    sigma_cdp: float | None,
    adversary: str,
    conversion: str,
    rtol: float,
    max_subsets: int,
    force: bool,
    as_json: bool,
) -> None:
    """Smallest sigma_cor with achieved epsilon <= target (conservative log-bisection)."""
    if sigma_cdp is not None:
        _positive("--sigma-cdp", sigma_cdp)
    _positive("--epsilon", epsilon)
    _positive("--clip", clip)
    graph = _graph(graph_spec, connected="DECOR accounting")
    out, warns = calibrate_decor_json(
        graph,
        graph_spec,
        epsilon=epsilon,
        delta=delta,
        steps=steps,
        sigma_cdp=sigma_cdp,
        clip=clip,
        adversary=adversary,
        conversion=conversion,
        rtol=rtol,
        max_subsets=max_subsets,
        force=force,
    )
    for w in warns:
        click.echo(f"warning: {w}", err=True)
    _emit(out, as_json, "DECOR calibration")


@calibrate.command("dpsgd")
@click.option("--epsilon", type=float, required=True)
@click.option("--delta", type=float, required=True)
@click.option("--sampling-rate", type=float, required=True)
@click.option("--steps", type=click.IntRange(min=1), required=True)
@_ACCOUNTANT
@_SAMPLING
@_NEIGHBOURING
@_DATASET_SIZE
@_THREAT_MODEL
@click.option("--json", "as_json", is_flag=True)
def calibrate_dpsgd_cmd(
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    accountant: str,
    sampling: str,
    neighbouring: str,
    dataset_size: int | None,
    threat_model: str,
    as_json: bool,
) -> None:
    """Smallest noise multiplier for a target epsilon; the result is certified by the tightest
    accountant (the label names the one that produced the achieved epsilon)."""
    event: dict[str, Any] = dict(
        sampling_rate=sampling_rate,
        steps=steps,
        delta=delta,
        sampling=sampling,
        neighbouring=neighbouring,
        dataset_size=dataset_size,
    )
    out = calibrate_dpsgd_json(
        epsilon=epsilon, accountant=accountant, threat_model=threat_model, **event
    )
    _emit(out, as_json, "DP-SGD calibration")


# --------------------------------------------------------------------------- plan (nominal)
@click.group()
def plan() -> None:
    """The papers' closed-form noise formulas (nominal) and the epsilon they really give."""


@plan.command("privsgp")
@click.option(
    "--gradient-bound",
    "G",
    type=float,
    required=True,
    help="G, the per-sample gradient bound (eq. (11) uses sensitivity 3G; the accounted line (4 - 2/J) G).",
)
@click.option(
    "--steps", type=click.IntRange(min=1), default=None, help="K; omit to use Corollary 1's K*."
)
@click.option("--local-samples", "J", type=int, required=True)
@click.option("--epsilon", type=float, required=True)
@click.option("--delta", type=float, required=True)
@click.option("--c2", type=float, default=1.0, show_default=True)
@click.option(
    "--A",
    "A",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Cor 1 constant A (for K*).",
)
@click.option("--nodes", type=click.IntRange(min=1), default=None)
@click.option("--smoothness", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option("--dim", type=click.IntRange(min=1), default=None)
@click.option("--json", "as_json", is_flag=True)
def plan_privsgp_cmd(
    G: float,
    steps: int | None,
    J: int,
    epsilon: float,
    delta: float,
    c2: float,
    A: float | None,
    nodes: int | None,
    smoothness: float | None,
    dim: int | None,
    as_json: bool,
) -> None:
    """PrivSGP-VR Theorem 2 sigma_i (and Corollary 1 K*, U* with uniform budgets)."""
    extra: dict[str, Any] = {}
    if steps is None:
        if A is None or nodes is None or smoothness is None or dim is None:
            raise PrivacyError("give --steps, or --A --nodes --smoothness --dim for K*")
        k_star, u_star = privsgp_optimal_steps(
            A=A,
            local_samples=J,
            n=nodes,
            smoothness=smoothness,
            dim=dim,
            gradient_bound=G,
            epsilons=[epsilon] * nodes,
            deltas=[delta] * nodes,
            c2=c2,
        )
        extra = {"K_star": k_star, "utility_star": u_star}
        steps = max(1, round(k_star))
    result = privsgp_plan(
        gradient_bound=G, steps=steps, local_samples=J, epsilon=epsilon, delta=delta, c2=c2
    )
    _emit({**result.to_dict(), "steps": steps, **extra}, as_json, "PrivSGP-VR (nominal)")


@plan.command("porter")
@click.option("--tau", type=float, required=True, help="Clipping threshold.")
@click.option("--steps", type=click.IntRange(min=1), required=True)
@click.option("--local-samples", "m", type=int, required=True)
@click.option("--epsilon", type=float, required=True)
@click.option("--delta", type=float, required=True)
@click.option("--c", type=float, default=1.0, show_default=True)
@click.option("--dim", type=click.IntRange(min=1), default=None)
@click.option("--json", "as_json", is_flag=True)
def plan_porter_cmd(
    tau: float,
    steps: int,
    m: int,
    epsilon: float,
    delta: float,
    c: float,
    dim: int | None,
    as_json: bool,
) -> None:
    """PORTER-DP Theorem 1 sigma_p."""
    result = porter_plan(
        tau=tau, steps=steps, delta=delta, local_samples=m, epsilon=epsilon, c=c, dim=dim
    )
    _emit(result.to_dict(), as_json, "PORTER-DP (nominal)")


@plan.command("robust-hdp")
@click.option("--epsilon", type=float, required=True)
@click.option("--delta", type=float, required=True)
@click.option("--batch-size", type=int, required=True)
@click.option("--dataset-size", type=click.IntRange(min=1), required=True)
@click.option("--local-epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--no-round", is_flag=True, help="Do not round z to 2 decimals.")
@click.option("--json", "as_json", is_flag=True)
def plan_robust_hdp_cmd(
    epsilon: float,
    delta: float,
    batch_size: int,
    dataset_size: int,
    local_epochs: int,
    rounds: int,
    no_round: bool,
    as_json: bool,
) -> None:
    """Robust-HDP reference-code z_i (bisection, 2-decimal rounding)."""
    result = robust_hdp_plan(
        epsilon=epsilon,
        delta=delta,
        batch_size=batch_size,
        dataset_size=dataset_size,
        local_epochs=local_epochs,
        rounds=rounds,
        round_to=None if no_round else 2,
    )
    _emit(result.to_dict(), as_json, "Robust-HDP (nominal)")
