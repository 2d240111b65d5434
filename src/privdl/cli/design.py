"""``privdl design-noise``: an edge-wise noise design for DECOR, certified by the accountant."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import click

from privdl.cli.account import _json_default, _positive
from privdl.errors import ConfigError, PrivacyError


@click.command("design-noise")
@click.option(
    "--graph", "graph_spec", required=True, help="Graph spec (er:20:0.4:1, ring:16, ...)."
)
@click.option("--epsilon", type=float, required=True, help="Target epsilon (user level).")
@click.option("--delta", type=float, required=True, help="Target delta.")
@click.option("--steps", type=click.IntRange(min=1), required=True, help="DECOR steps T.")
@click.option("--clip", type=float, default=1.0, show_default=True, help="Clipping threshold C.")
@click.option(
    "--adversary", default="eavesdropper", show_default=True,
    help="eavesdropper, curious or collusion:Q.",
)  # fmt: skip
@click.option(
    "--mixing", default="metropolis", show_default=True, help="Gossip matrix W of the objective."
)
@click.option(
    "--horizon", type=click.IntRange(min=1), default=10, show_default=True,
    help="K: the objective is the noise left after K gossip steps, sum_k tr(W^k Sigma W^k^T).",
)  # fmt: skip
@click.option(
    "--solver", type=click.Choice(["auto", "cvxpy", "first-order"]), default="auto",
    show_default=True, help="auto: cvxpy (Clarabel, SCS) up to 40 nodes, first-order above.",
)  # fmt: skip
@click.option(
    "--max-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
    help="Stop the first-order solver after this long (its best point so far, certified).",
)  # fmt: skip
@click.option(
    "--whisper", is_flag=True,
    help="Also Whisper D-SGD's free covariance (needs a trusted dealer; eavesdropper only).",
)  # fmt: skip
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the design (JSON) for `privdl run decor --noise-design FILE`.")  # fmt: skip
@click.option(
    "--whisper-out", type=click.Path(dir_okay=False), default=None,
    help="With --whisper: write its covariance (JSON) for `privdl run decor --noise-design "
    "FILE` (a simulated trusted dealer; eavesdropper only).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def design_noise_cmd(
    graph_spec: str,
    epsilon: float,
    delta: float,
    steps: int,
    clip: float,
    adversary: str,
    mixing: str,
    horizon: int,
    solver: str,
    max_seconds: float | None,
    whisper: bool,
    out_path: str | None,
    whisper_out: str | None,
    as_json: bool,
) -> None:
    """Optimize DECOR's per-node and per-edge noise for (epsilon, delta)."""
    from privdl.design.api import design_noise
    from privdl.mechanisms.noise_design import save_design
    from privdl.topology import parse_graph

    _positive("--epsilon", epsilon)
    _positive("--clip", clip)
    for flag, path in (("--out", out_path), ("--whisper-out", whisper_out)):
        if path is not None and not Path(path).parent.exists():
            raise ConfigError(f"{flag} {path!r}: no such directory")
    if whisper_out is not None and not whisper:
        raise ConfigError("--whisper-out needs --whisper")
    if adversary.strip().lower() == "ldp":
        raise PrivacyError("--adversary ldp has no correlated noise to design")
    topo = parse_graph(graph_spec)
    topo.require_connected("a noise design")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = design_noise(
            topo, epsilon=epsilon, delta=delta, steps=steps, clip=clip, adversary=adversary,
            mixing=mixing, horizon=horizon, solver=solver, whisper=whisper,
            max_seconds=max_seconds,
        )  # fmt: skip
    for w in {str(w.message) for w in caught}:
        click.echo(f"warning: {w}", err=True)
    if out_path is not None:
        save_design(result.design, out_path)
    if whisper_out is not None and result.whisper is not None:
        result.whisper.save(whisper_out)
    out = {"graph": graph_spec, **result.to_dict(), "out": out_path, "whisper_out": whisper_out}
    if as_json:
        click.echo(json.dumps(out, default=_json_default, allow_nan=True))
        return
    _print(out)


def _print(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"noise design for {out['graph']} ({out['adversary']})")
    table.add_column("quantity")
    table.add_column("value")
    res = out["residual"]
    rows = [
        ("epsilon accounted", f"{out['epsilon_accounted']:.6g}"),
        ("label", out["epsilon_label"]),
        ("residual: edge-optimized", f"{res['design']:.6g}"),
        ("residual: DECOR best scalar", f"{res['decor_scalar']:.6g}"),
        ("ratio vs DECOR", f"{out['residual_ratio_vs_decor']:.4f}"),
        ("residual: LDP", f"{res['ldp']:.6g}"),
        ("residual: CDP (trusted curator)", f"{res['cdp']:.6g}"),
    ]
    if res["whisper"] is not None:
        rows.append(("residual: Whisper (trusted dealer)", f"{res['whisper']:.6g}"))
    for name in ("edge_var", "node_var"):
        s = out[name]
        rows.append(
            (name, f"min {s['min']:.4g}  median {s['median']:.4g}  max {s['max']:.4g}  "
                   f"zeros {s['zeros']}")
        )  # fmt: skip
    dec = out["decor_scalar"]
    rows.append(
        ("DECOR scalar", f"sigma_cdp {dec['sigma_cdp']:.4g}, sigma_cor {dec['sigma_cor']:.4g}")
    )
    rows.append(
        ("objective", f"sum_(k=1..{out['horizon']}) tr(W^k Sigma W^k^T), W {out['mixing']}")
    )
    rows.append(
        ("solver", f"{out['solver'].get('method')} ({out['solver'].get('seconds', 0):.3g} s)")
    )
    if out["out"]:
        rows.append(("written", out["out"]))
    for key, value in rows:
        table.add_row(key, str(value))
    Console().print(table)
