"""Entry point of the ``privdl`` command.

Every sub-command lives in its own module under :mod:`privdl.cli` and exposes click commands;
they are attached here. User-facing errors (:class:`privdl.errors.PrivdlError`) become one line on
stderr and exit code 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any

import click

from privdl import __version__
from privdl.engine.allocator import tune_allocator
from privdl.errors import PrivdlError, ReportedError

#: (module, attribute) pairs of the click commands attached to the main group.
_COMMANDS: tuple[tuple[str, str], ...] = (
    ("privdl.cli.graph", "graph"),
    ("privdl.cli.run", "run"),
    ("privdl.cli.run", "demo"),
    ("privdl.cli.run", "report"),
    ("privdl.cli.run", "list_algorithms"),
    ("privdl.cli.account", "account"),
    ("privdl.cli.account", "calibrate"),
    ("privdl.cli.account", "plan"),
    ("privdl.cli.audit", "audit"),
    ("privdl.cli.reproduce", "reproduce"),
    ("privdl.cli.launch", "launch"),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="privdl")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Differentially private decentralized and federated learning."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _attach() -> None:
    for module_name, attr in _COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a sub-command not built yet
            if exc.name == module_name:
                continue
            raise
        command = getattr(module, attr, None)
        if command is not None:
            cli.add_command(command)


_attach()


def _one_line_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """privdl's own warnings (privacy weaker than asked, RPCA not converged) as one line."""
    if category.__module__.startswith("privdl"):
        click.echo(f"warning: {message}", err=True)
    else:
        _default_showwarning(message, category, *args, **kwargs)


_default_showwarning = warnings.showwarning


def _out_of_range() -> tuple[type[BaseException], ...]:
    import numpy as np

    return (
        OverflowError,
        ZeroDivisionError,
        FloatingPointError,
        MemoryError,
        np.linalg.LinAlgError,
    )


_OUT_OF_RANGE = _out_of_range()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (2 for bad input)."""
    tune_allocator()  # step-sized tensors are reused, not faulted in anew every step
    args = list(argv if argv is not None else sys.argv[1:])
    debug = "--debug" in args
    if debug:  # accepted anywhere on the line, not only before the sub-command
        args = ["--debug", *[a for a in args if a != "--debug"]]
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            cli.main(args=args, prog_name="privdl", standalone_mode=False)
    except ReportedError:
        return 2
    except PrivdlError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        return 2
    except _OUT_OF_RANGE as exc:  # finite but extreme values that passed validation
        if debug:
            raise
        click.echo(
            f"error: the values given are outside the range privdl can compute with "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}); "
            "use less extreme values (--debug shows where it failed)",
            err=True,
        )
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.UsageError as exc:  # one line, like every other bad input
        where = exc.ctx.command_path if exc.ctx is not None else "privdl"
        click.echo(f"error: {exc.format_message()} (see '{where} --help')", err=True)
        return 2
    except click.ClickException as exc:
        exc.show()
        return 2 if exc.exit_code in (1, 2) else exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
