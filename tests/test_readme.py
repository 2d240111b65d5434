"""The README's examples run in the order written (issue 32).

The cheap commands (graphs, accounting, listings) run in the default suite; every command and
the Python example run, in order, under ``-m slow`` (commands that need the MNIST files run
where ``PRIVDL_DATA_DIR`` holds them, those for ``--device cuda`` where CUDA is available).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from privdl.cli.main import main

README = Path(__file__).resolve().parents[1] / "README.md"
#: Commands cheap enough for the default suite (by their sub-command, or its first words).
CHEAP = ("algorithms", "graph", "account", "calibrate", "plan", "reproduce --list")


def examples() -> list[tuple[str, str]]:
    """``("privdl", command)`` for each ``privdl`` command of the README's bash blocks and
    ``("python", code)`` for each Python block, in the order written."""
    out: list[tuple[str, str]] = []
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", README.read_text(), flags=re.S):
        if lang == "python":
            out.append(("python", body))
            continue
        if lang != "bash":
            continue
        for line in body.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                command = part.split("#", 1)[0].strip()
                if command.startswith("privdl "):
                    out.append(("privdl", " ".join(command.split())))
    return out


def _cheap(command: str) -> bool:
    words = command.split()[1:]
    return any(words[: len(c.split())] == c.split() for c in CHEAP)


def _skip_reason(command: str) -> str | None:
    if "DATA" in command.split() and not os.environ.get("PRIVDL_DATA_DIR"):
        return "needs the MNIST files (PRIVDL_DATA_DIR)"
    if "--device cuda" in command:
        import torch

        if not torch.cuda.is_available():
            return "needs CUDA"
    return None


def _run(command: str) -> None:
    argv = shlex.split(command)[1:]
    if os.environ.get("PRIVDL_DATA_DIR"):
        argv = [os.environ["PRIVDL_DATA_DIR"] if a == "DATA" else a for a in argv]
    assert main(argv) == 0, command


def test_the_readme_lists_its_examples_in_order():
    found = examples()
    commands = [c for kind, c in found if kind == "privdl"]
    assert commands[0] == "privdl demo" and len(commands) >= 20
    cheap = [c for c in commands if _cheap(c)]
    assert len(cheap) >= 7, cheap
    run = commands.index(next(c for c in commands if c.startswith("privdl run decor")))
    assert commands.index("privdl run --resume runs/decor") > run
    assert any(kind == "python" for kind, _ in found)


def test_the_readmes_cheap_examples_run_in_order(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ran = 0
    for kind, command in examples():
        if kind == "privdl" and _cheap(command):
            _run(command)
            ran += 1
    out = capsys.readouterr().out
    assert ran >= 7 and '"epsilon"' in out and "decor-fig2" in out


@pytest.mark.slow
def test_every_readme_example_runs_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    skipped = []
    for kind, text in examples():
        if kind == "python":
            exec(compile(text, "README.md", "exec"), {})  # noqa: S102 - the README's own code
            continue
        reason = _skip_reason(text)
        if reason is not None:
            skipped.append((text, reason))
            continue
        _run(text)
    assert (tmp_path / "runs" / "decor-api" / "summary.json").is_file()
    assert (tmp_path / "report" / "metrics.csv").is_file()
