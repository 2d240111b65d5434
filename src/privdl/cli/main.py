"""Entry point of the ``privdl`` command.

Every sub-command lives in its own module under :mod:`privdl.cli` and exposes click commands;
the main group imports a command's module only when that command runs (or shows its help), so
``privdl --help``, ``privdl graph`` and ``privdl account`` start without torch. User-facing
errors (:class:`privdl.errors.PrivdlError`) become one line on stderr and exit code 2;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from typing import Any

import click

from privdl import __version__
from privdl.cli.options import show_defaults
from privdl.errors import PrivdlError, ReportedError, out_of_range
from privdl.malloc import tune_allocator  # not privdl.engine's: that package imports torch
from privdl.openmp import limit_spin_wait

#: name -> (module, attribute, short help) of the commands of the main group. The short help is
#: what ``privdl --help`` lists without importing the module (a test keeps it equal to the
#: command's own).
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "account": ("privdl.cli.account", "account",
                "Privacy accounting: what (epsilon, delta) does a deployment give?"),
    "algorithms": ("privdl.cli.run", "list_algorithms",
                   "The algorithms privdl can run: name, family, options."),
    "audit": ("privdl.cli.audit", "audit",
              "Audit ALGORITHM as implemented: a lower bound on epsilon."),
    "calibrate": ("privdl.cli.account", "calibrate",
                  "Noise calibration: what noise reaches a target (epsilon, delta)?"),
    "demo": ("privdl.cli.run", "demo",
             "The main job: private vs non-private learning on a9a over ring:16."),
    "design-noise": ("privdl.cli.design", "design_noise_cmd",
                     "Optimize DECOR's per-node and per-edge noise for (epsilon, delta)."),
    "graph": ("privdl.cli.graph", "graph",
              "Print the facts of graph SPEC and of its mixing matrix."),
    "identities": ("privdl.cli.identities", "identities",
                   "Make an Ed25519 identity key per node and their roster."),
    "launch": ("privdl.cli.launch", "launch",
               "Train ALGORITHM on several processes, or as one torchrun rank."),
    "plan": ("privdl.cli.account", "plan",
             "The papers' closed-form noise formulas and the epsilon they give."),
    "report": ("privdl.cli.run", "report",
               "Make a markdown table, PNG plots (and a CSV) from run directories."),
    "reproduce": ("privdl.cli.reproduce", "reproduce",
                  "Reproduce a paper figure/table: report.md, PNGs, summary.json."),
    "run": ("privdl.cli.run", "run", "Train ALGORITHM and record metrics and privacy spent."),
    "serve": ("privdl.cli.serve", "serve",
              "The accountant as a local web page (offline, loopback only)."),
}  # fmt: skip


class _LazyGroup(click.Group):
    """Sub-commands imported on first use; ``--help`` lists them from :data:`_COMMANDS`."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        present = [n for n, (mod, _, _) in _COMMANDS.items() if _module_exists(mod)]
        return sorted({*present, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name not in _COMMANDS or not _module_exists(_COMMANDS[cmd_name][0]):
            return None
        module_name, attr, _ = _COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module_name), attr, None)
        if command is None:
            return None
        show_defaults(command)
        self.commands[cmd_name] = command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in _COMMANDS:
                rows.append((name, _COMMANDS[name][2]))
            elif (command := self.commands[name]) is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(name: str) -> bool:
    """Whether the module can be imported, found without importing it (a sub-command not
    built yet is left out)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="privdl")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Differentially private decentralized and federated learning."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _one_line_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """privdl's own warnings (privacy weaker than asked, RPCA not converged) as one line."""
    if category.__module__.startswith("privdl"):
        click.echo(f"warning: {message}", err=True)
    else:
        _default_showwarning(message, category, *args, **kwargs)


_default_showwarning = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (2 for bad input)."""
    tune_allocator()  # step-sized tensors are reused, not faulted in anew every step
    limit_spin_wait()  # before torch loads: its OpenMP workers then leave the noise threads alone
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
    except out_of_range() as exc:  # finite but extreme values that passed validation
        if debug:
            raise
        click.echo(
            f"error: the values given are outside the range privdl can compute with "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}); "
            "use less extreme values (--debug shows where it failed)",
            err=True,
        )
        return 2
    except OSError as exc:  # a path the system refuses (too long, read-only, unreadable)
        if debug:
            raise
        name = str(exc.filename or "")
        where = f"{name if len(name) <= 80 else name[:38] + '...' + name[-38:]}: " if name else ""
        click.echo(
            f"error: {where}{exc.strerror or type(exc).__name__} (--debug shows where)", err=True
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
