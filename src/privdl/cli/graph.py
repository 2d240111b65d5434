"""``privdl graph SPEC``: a graph's spectral facts (and its mixing matrix's)."""

from __future__ import annotations

import json
from typing import Any

import click

from privdl.topology import (
    MIXING_RULES,
    ExponentialGraph,
    Topology,
    mixing_matrix,
    parse_topology,
)
from privdl.topology.mixing import heterogeneity_factor


@click.command("graph")
@click.argument("spec")
@click.option(
    "--mixing",
    type=click.Choice(MIXING_RULES),
    default="metropolis",
    show_default=True,
    help="Mixing rule whose consensus facts are reported.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def graph(spec: str, mixing: str, as_json: bool) -> None:
    """Print the facts of graph SPEC (ring:16, torus:4x4, er:10:0.8:1, expo:16, FILE, ...)."""
    info = topology_facts(parse_topology(spec), mixing)
    if as_json:
        click.echo(json.dumps(info, indent=2, sort_keys=True))
        return
    for key, value in info.items():
        if isinstance(value, dict):
            for k2, v2 in value.items():
                click.echo(f"{key}.{k2:<24} {_fmt(v2)}")
        else:
            click.echo(f"{key:<31} {_fmt(value)}")


def topology_facts(topo: Topology | ExponentialGraph, mixing: str) -> dict[str, Any]:
    """The facts ``privdl graph --json`` prints (``privdl serve`` shows the same)."""
    info = topo.summary()
    if isinstance(topo, ExponentialGraph):
        info["mixing"] = {"rule": "expo", "doubly_stochastic": True}
    elif topo.is_connected or mixing in ("average",):
        w = mixing_matrix(topo, mixing)
        info["mixing"] = w.summary()
        info["mixing"]["heterogeneity_H"] = heterogeneity_factor(w, topo)
    return info


def _fmt(v) -> str:
    if v is None:  # e.g. push-sum's consensus rate: no such p for a W not doubly stochastic
        return "n/a"
    return f"{v:.6g}" if isinstance(v, float) else str(v)
