"""``privdl identities --nodes N --out DIR``: Ed25519 identities and their roster.

Authenticated key agreement (docs/security.md s.3): each node's identity key
``DIR/node-<i>.ed25519`` (mode 0600) and the roster ``DIR/roster.json`` that every party is given.
Hand each party only its own nodes' key files; run with ``--roster DIR/roster.json --identities
FOLDER``.
"""

from __future__ import annotations

from pathlib import Path

import click

from privdl.errors import ConfigError
from privdl.mechanisms.identity import make_identities

#: More nodes than this is a typo, not a deployment (one file each).
MAX_NODES = 100_000


@click.command("identities")
@click.option("--nodes", type=int, required=True, help="Number of nodes (ids 0..N-1).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="A new folder.")
def identities(nodes: int, out: Path) -> None:
    """Make an Ed25519 identity key per node and the roster of their public keys."""
    if not 1 <= nodes <= MAX_NODES:
        raise ConfigError(f"--nodes must be between 1 and {MAX_NODES}; got {nodes}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"{out} exists and is not an empty folder: identities are never overwritten"
        )
    roster = make_identities(nodes, out)
    click.echo(f"{len(roster.keys)} identity keys in {out} (node-I.ed25519, mode 0600)")
    click.echo(f"roster: {out / 'roster.json'} (public: give it to every party)")
