"""``privdl serve``: the accountant as a local web page (docs/serve.md)."""

from __future__ import annotations

import click


@click.command("serve")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; the default answers this machine only.",
)
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=8765,
    show_default=True,
    help="Port (0: any free port).",
)
@click.option("--verbose", is_flag=True, help="Log every request on stderr.")
def serve(host: str, port: int, verbose: bool) -> None:
    """The accountant as a local web page (offline, loopback only by default)."""
    from privdl.errors import ConfigError
    from privdl.serve.app import is_loopback, make_server

    try:
        server = make_server(host, port, quiet=not verbose)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    h, p = str(server.server_address[0]), server.server_address[1]
    url = f"http://{h if ':' not in h else f'[{h}]'}:{p}/"
    if is_loopback(host):
        where = "loopback only: reachable from this machine, not from the network"
    else:
        where = (
            f"WARNING: listening on {host}, reachable from other machines; the page has no "
            "authentication (use the default --host 127.0.0.1 unless you mean it)"
        )
    click.echo(f"privdl serve: {url} ({where}); Ctrl-C stops it", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo("privdl serve: stopped", err=True)
    finally:
        server.server_close()
