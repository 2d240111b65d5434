"""``privdl reproduce NAME [--quick]``: a paper figure or table, with the paper's numbers beside ours."""

from __future__ import annotations

from pathlib import Path

import click

from privdl.errors import ConfigError


@click.command("reproduce")
@click.argument("name", required=False)
@click.option("--list", "list_", is_flag=True, help="List the available reproductions.")
@click.option("--quick", is_flag=True, help="CI-sized version (fewer steps/seeds).")
@click.option("--out", type=click.Path(), help="Output directory (default reproductions/NAME).")
@click.option("--data-dir", help="Where dataset files are looked up first.")
def reproduce(
    name: str | None, list_: bool, quick: bool, out: str | None, data_dir: str | None
) -> None:
    """Reproduce a paper figure/table: writes report.md, PNG figures and summary.json."""
    from privdl.experiments import get, registry

    if list_ or name is None:
        if name is None and not list_:
            raise ConfigError("give a reproduction NAME or --list")
        for rep in registry().values():
            click.echo(
                f"{rep.name:<28} {rep.paper:<14} {rep.description} (full: {rep.full_runtime})"
            )
        return
    rep = get(name)
    out_dir = Path(out or f"reproductions/{name}{'-quick' if quick else ''}")
    kwargs = {"quick": quick}
    if data_dir:
        kwargs["data_dir"] = data_dir
    rep.run(out_dir, **kwargs)
    click.echo((out_dir / "report.md").read_text())
    click.echo(f"written: {out_dir}")
