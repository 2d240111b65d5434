"""``privdl reproduce NAME [--quick]``: a paper figure or table, with the paper's numbers beside ours."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import click

from privdl.errors import ConfigError
from privdl.records import RunRecords


@click.command("reproduce")
@click.argument("name", required=False)
@click.option("--list", "list_", is_flag=True, help="List the available reproductions.")
@click.option("--quick", is_flag=True, help="CI-sized version (fewer steps/seeds).")
@click.option(
    "--out",
    type=click.Path(),
    help="Output directory (default reproductions/NAME, NAME-quick with --quick).",
)
@click.option("--data-dir", help="Where dataset files are looked up first.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the finished runs (cells) in --out and train only the missing ones (Robust-HDP tables, DECOR Figs 1a-1c, the seeds of PORTER and the PrivSGP-VR MNIST sweeps).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a preset value for this run (repeatable), e.g. --set dists=Dist1,Dist6.",
)
def reproduce(
    name: str | None,
    list_: bool,
    quick: bool,
    out: str | None,
    data_dir: str | None,
    device: str,
    resume: bool,
    overrides: tuple[str, ...],
) -> None:
    """Reproduce a paper figure/table: writes report.md, PNG figures and summary.json."""
    # heavy: imported when the command runs
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
    kwargs: dict[str, Any] = {"quick": quick}
    if data_dir:
        kwargs["data_dir"] = data_dir
    accepted = inspect.signature(rep.run).parameters
    if device != "cpu":
        if "device" not in accepted:
            raise ConfigError(f"reproduction {name!r} runs on the CPU only; drop --device")
        kwargs["device"] = _check_device(device)
    if resume:
        if "resume" not in accepted:
            raise ConfigError(f"reproduction {name!r} cannot resume; drop --resume")
        kwargs["resume"] = True
    if overrides:
        if "overrides" not in accepted:
            raise ConfigError(f"reproduction {name!r} takes no --set overrides")
        kwargs["overrides"] = _parse_overrides(overrides)

    fresh = not out_dir.exists()
    try:
        with RunRecords(out_dir).exclusive():  # one writer per output directory, as for runs
            _refuse_another_reproduction(out_dir, name)
            (out_dir / MARKER).write_text(name + "\n")
            rep.run(out_dir, **kwargs)
    except BaseException:
        # refused (bad --set, missing data) before writing anything: leave no empty directory
        if fresh and out_dir.is_dir() and {p.name for p in out_dir.iterdir()} <= {".lock", MARKER}:
            import shutil

            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    click.echo((out_dir / "report.md").read_text())
    click.echo(f"written: {out_dir}")
    tally = check_tally(out_dir / "summary.json")
    if tally:
        click.echo(tally)


def check_tally(summary_path: Path) -> str | None:
    """One line: how many of a reproduction's checks hold, naming the ones that do not.

    Reproductions keep ``checks`` as ``{name: bool}`` or as ``[{"name", "pass", ...}]``.
    """
    import json

    try:
        checks = json.loads(summary_path.read_text()).get("checks")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(checks, dict):
        results = [(str(k), bool(v)) for k, v in checks.items() if isinstance(v, bool)]
    elif isinstance(checks, list):
        results = [
            (str(c.get("name")), bool(c.get("pass")))
            for c in checks
            if isinstance(c, dict) and "pass" in c
        ]
    else:
        return None
    if not results:
        return None
    failed = [name for name, ok in results if not ok]
    line = f"checks: {len(results) - len(failed)} of {len(results)} hold"
    return line + (f"; failed: {'; '.join(failed)}" if failed else "")


#: The file naming the reproduction an output directory holds (written before it runs).
MARKER = ".privdl-reproduction"


def _refuse_another_reproduction(out_dir: Path, name: str) -> None:
    """An output directory holding another reproduction is refused (its figures, cells and
    report would be mixed with this one's), named by its marker or its summary.json."""
    import json

    held = None
    if (out_dir / MARKER).is_file():
        held = (out_dir / MARKER).read_text().strip()
    elif (out_dir / "summary.json").is_file():
        try:
            held = json.loads((out_dir / "summary.json").read_text()).get("reproduction")
        except (ValueError, AttributeError):
            held = None
    if held and held != name:
        raise ConfigError(
            f"{out_dir} holds reproduction {held!r}, not {name!r}: choose another --out"
        )


def _check_device(device: str) -> str:
    """``cpu``/``cuda``/``cuda:N``, refused with one line when CUDA is absent."""
    import torch

    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ConfigError(f"--device must be cpu, cuda or cuda:N; got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available on this machine")
    return device


def _parse_overrides(items: tuple[str, ...]) -> dict[str, str]:
    """``KEY=VALUE`` strings to a dict (values stay strings; each reproduction parses its own)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set takes KEY=VALUE; got {item!r}")
        out[key.strip()] = value.strip()
    return out
