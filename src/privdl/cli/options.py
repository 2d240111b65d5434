"""How every ``privdl`` option states its default in ``--help`` (issue 32: every option has help
text and shows its default).

click puts a string ``show_default`` in parentheses (``[default: (none)]``); :func:`with_default`
writes the default into the help text instead, as click shows a real default.
"""

from __future__ import annotations

import click


def with_default(text: str | None, shown: str) -> str:
    """``text`` followed by ``[default: shown]``, as click shows a default."""
    return f"{text or ''}  [default: {shown}]".strip()


def says_default(option: click.Option) -> bool:
    """Whether ``option``'s help shows its default (click's or written in its text)."""
    return bool(option.show_default) or "default" in (option.help or "").lower()


def show_defaults(command: click.Command) -> None:
    """Every option of ``command`` states its default: one whose help does not say it shows
    the value a command gets when it is not given (``off`` for a flag, ``none`` for no value,
    else click's own)."""
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden or says_default(param):
            continue
        if param.is_flag and not param.secondary_opts:
            param.help = with_default(param.help, "on" if param.default is True else "off")
        elif param.default in (None, ()) or param.default is getattr(click.core, "UNSET", None):
            param.help = with_default(param.help, "none")
        else:
            param.show_default = True
