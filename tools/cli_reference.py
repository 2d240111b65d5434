"""The command-line reference, generated from the click commands themselves.

Renders ``privdl --help`` and the help of every sub-command (groups recursively) as markdown, so
the reference cannot drift from the CLI. Two uses:

* a MkDocs hook (``hooks:`` in ``mkdocs.yml``): the marker line in ``docs/cli.md`` is replaced by
  the rendered help at build time;
* a script: ``python tools/cli_reference.py`` prints the same markdown.
"""

from __future__ import annotations

from typing import Any

import click

#: The line in docs/cli.md that the generated reference replaces.
MARKER = "<!-- privdl-cli-reference -->"
#: The page that holds the marker (relative to docs/).
PAGE = "cli.md"
#: A fixed width, so the rendered help does not depend on the terminal that builds the site.
WIDTH = 100


def _sections(
    command: click.Command, name: str, parent: click.Context | None, level: int
) -> list[str]:
    ctx = click.Context(
        command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH
    )
    lines = [f"{'#' * level} `{ctx.command_path}`", "", "```text", command.get_help(ctx), "```", ""]
    if isinstance(command, click.Group):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                lines += _sections(sub, sub_name, ctx, min(level + 1, 4))
    return lines


def render() -> str:
    """Markdown with the help of ``privdl`` and of every (sub-)command, in the CLI's order."""
    from privdl.cli.main import cli

    return "\n".join(_sections(cli, "privdl", None, 2))


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: put the generated reference in place of the marker on the CLI page."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise RuntimeError(f"docs/{PAGE} has lost its marker line {MARKER}")
    return markdown.replace(MARKER, render())


if __name__ == "__main__":
    print(render())
