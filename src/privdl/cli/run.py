"""``privdl run`` (one configured run), ``privdl demo`` (the README's main job), ``privdl
algorithms`` (what the registry holds).

``privdl run``'s options are made from the registered algorithms' configuration models
(:func:`privdl.registry.config_fields`): one option per config key, with the model's description
as its help, so the CLI, config files and ``privdl.train`` accept the same keys.
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any

import click

from privdl import loop  # loop.train / loop.resume looked up at call time (patchable)
from privdl.cli.options import with_default
from privdl.config import CommonConfig, load_config_file
from privdl.errors import ConfigError
from privdl.records import (
    SEEDS_PLAN,
    RunRecords,
    check_out_dir,
    read_seeds_plan,
    seed_run_dirs,
    seeds_plan_given,
    write_seeds_plan,
)
from privdl.registry import algorithms, config_fields, make_config


def _click_type(annotation: Any) -> Any:
    """int or float for numeric options (so ``--steps x`` is a usage error), else text."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _click_type(inner[0]) if len(inner) == 1 else str
    if annotation is int:
        return int
    if annotation is float:
        return float
    return str


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def field_default(key: str) -> str | None:
    """What ``--help`` shows as the default of config key ``key``: the configuration models'
    default (``ring:16; server for robust-hdp, ...`` where families differ), or None where the
    description already says it."""
    from pydantic_core import PydanticUndefined

    by_default: dict[str, list[str]] = {}
    for name, entry in algorithms().items():
        info = entry.recipe.config_model.model_fields.get(key)
        if info is not None and info.default is not PydanticUndefined:
            by_default.setdefault(_shown(info.default), []).append(name)
    if not by_default:
        return None
    common, *others = sorted(by_default, key=lambda d: -len(by_default[d]))
    if not others and "default" in (config_fields()[key].description or "").lower():
        return None
    return "; ".join([common, *(f"{d} for {', '.join(by_default[d])}" for d in others)])


def _field_options() -> dict[str, click.Option]:
    """One option per config key of any registered algorithm (``--set`` takes any key too);
    its help is the model's description and shows the model's default. The option's own
    default stays None: a value not given is left to the config file and the model."""
    out: dict[str, click.Option] = {}
    for key, info in config_fields().items():
        if key == "algorithm":
            continue
        shown = field_default(key)
        out[key] = click.Option(
            [f"--{key.replace('_', '-')}", key], type=_click_type(info.annotation),
            help=with_default(info.description, shown) if shown else info.description,
            default=None,
        )  # fmt: skip
    return out


_OPTIONS = _field_options()
#: CLI flag -> config key for the options offered directly (others through --set KEY=VALUE).
_FLAGS = {key: key for key in _OPTIONS}


class AlgorithmName(click.ParamType):
    """An algorithm of the registry (checked when the command runs, so algorithms registered
    after import are accepted)."""

    name = "algorithm"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        names = list(algorithms())
        if value not in names:
            self.fail(f"{value!r} is not one of {', '.join(names)}", param, ctx)
        return str(value)


def command_line_values(
    config_file: str | None, algorithm: str | None, flags: dict, sets: tuple[str, ...]
) -> dict:
    """The config values of a command line: the file's, then the options', then ``--set``'s.

    A key given both by an option and by ``--set`` is refused (one of them was silently lost).
    """
    values: dict = load_config_file(config_file) if config_file else {}
    given = {"algorithm"} if algorithm else set()
    if algorithm:
        values["algorithm"] = algorithm
    for flag, key in _FLAGS.items():
        if flags.get(flag) is not None:
            values[key] = flags[flag]
            given.add(key)
    set_values = _parse_set(sets)
    both = sorted(given & set_values.keys())
    if both:
        raise ConfigError(f"{', '.join(both)} given both as an option and by --set: keep one")
    return {**values, **set_values}


def _parse_set(items: tuple[str, ...]) -> dict:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        key = key.strip().replace("-", "_")
        if key not in config_fields():
            raise ConfigError(f"unknown config key {key!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


#: ``--progress/--no-progress`` of run, launch and demo.
PROGRESS_HELP = with_default(
    "Progress on stderr: a bar, or (not a terminal) a short line about every 30 s "
    "(--no-progress: nothing).",
    "the bar if stderr is a terminal, else the lines",
)
#: ``--resume-if-exists``: what it does, for run and launch.
RESUME_IF_EXISTS_HELP = (
    "Resume the run in --out if it holds one started with the same options, else start it: "
    "the same command line starts or continues a run (torchrun --max-restarts, a cluster "
    "requeue; docs/distributed.md)."
)


def _run_params() -> list[click.Parameter]:
    return [
        click.Argument(["algorithm"], required=False, type=AlgorithmName()),
        click.Option(
            ["--config", "config_file"],
            type=click.Path(),
            help="TOML config file (its [run] table holds config keys; options override it).",
        ),
        *_OPTIONS.values(),
        click.Option(
            ["--set", "sets"], multiple=True, help="Any config key: --set KEY=VALUE (repeatable)."
        ),
        click.Option(
            ["--out"],
            type=click.Path(),
            help=with_default("Output directory: the run's records.", "runs/ALGORITHM"),
        ),
        click.Option(
            ["--seeds"],
            help=with_default(
                "Repeat over seeds, e.g. 1,2,3 or 1-5: runs in OUT/seed-K, then a mean ± std "
                "table.",
                "none, one run with --seed",
            ),
        ),
        click.Option(
            ["--resume", "resume_dir"],
            type=click.Path(),
            help="Continue the run (or the seed runs) in DIR with its saved config.",
        ),
        click.Option(["--resume-if-exists"], is_flag=True, help=RESUME_IF_EXISTS_HELP),
        click.Option(["--overwrite"], is_flag=True, help="Replace an earlier run in --out."),
        click.Option(["--progress/--no-progress"], default=None, help=PROGRESS_HELP),
    ]


def _run(
    algorithm, config_file, sets, out, seeds, resume_dir, resume_if_exists, overwrite, progress,
    **flags,
) -> None:  # fmt: skip
    if resume_dir:
        if resume_if_exists:
            raise ConfigError("give --resume DIR or --resume-if-exists (with --out), not both")
        refuse_options_with_resume(algorithm, config_file, sets, out, seeds, overwrite, flags)
        parent = Path(resume_dir)
        plan = None if (parent / "config.json").is_file() else read_seeds_plan(parent)
        if plan is not None:  # every seed of the sweep: the cut-off ones and those not started
            with RunRecords(parent).exclusive():  # one process writes a sweep
                _run_seeds(make_config(plan[1], saved=True), plan[0], parent, progress,
                           resume_existing=True)  # fmt: skip
            return
        dirs = seed_run_dirs(resume_dir)
        if (parent / "config.json").is_file() or not dirs:
            say_if_complete(parent)
            summary = loop.resume(resume_dir, progress=progress)
            _print_summary(summary, parent)
            return
        refuse_mixed_sweep(dirs, None, None)
        for d in dirs:
            say_if_complete(d)
            loop.resume(d, progress=progress)
        _print_repeats(dirs, parent)
        return
    if resume_if_exists and overwrite:
        raise ConfigError("give --resume-if-exists or --overwrite, not both")
    seed_list = None if seeds is None else parse_seeds(seeds)  # before any other work
    values = command_line_values(config_file, algorithm, flags, sets)
    cfg = make_config(values)
    out_dir = Path(out or f"runs/{cfg.algorithm}")
    check_out_dir(out_dir)
    if seed_list is None:
        if resume_if_exists and holds_run(out_dir, given_values(cfg, values)):
            say_if_complete(out_dir)
            summary = loop.resume(out_dir, progress=progress)
        else:
            summary = loop.train(cfg, out_dir, progress=progress, overwrite=overwrite)
        _print_summary(summary, out_dir)
        return
    if "seed" in values:
        raise ConfigError("give --seed or --seeds, not both")
    check_out_dir(out_dir / f"seed-{max(seed_list)}")  # the longest path it will make
    if (out_dir / SEEDS_PLAN).exists() and not (overwrite or resume_if_exists):
        raise ConfigError(
            f"{out_dir} already holds a --seeds sweep; use --resume {out_dir} (or "
            "--resume-if-exists) to continue it, or choose another --out (or --overwrite)"
        )
    with RunRecords(out_dir).exclusive():  # before anything in out_dir is touched
        if (out_dir / SEEDS_PLAN).exists() and resume_if_exists:
            plan = read_seeds_plan(out_dir)
            assert plan is not None
            loop.check_same_run(plan[1], given_values(cfg, values), out_dir)
            if plan[0] != seed_list:
                raise ConfigError(
                    f"{out_dir} holds a --seeds {','.join(map(str, plan[0]))} sweep, not --seeds "
                    f"{seeds}: give its seeds to resume it, or choose another --out"
                )
            _run_seeds(make_config(plan[1], saved=True), plan[0], out_dir, progress,
                       resume_existing=True)  # fmt: skip
            return
        write_seeds_plan(out_dir, seed_list, cfg.model_dump(), sorted(given_values(cfg, values)))
        _run_seeds(cfg, seed_list, out_dir, progress, overwrite=overwrite)


def say_if_complete(out_dir: Path) -> bool:
    """Say on stderr (one line) that the run in ``out_dir`` is complete, where it is: a resume
    then only prints its summary. Returns whether it is complete."""
    summary = RunRecords(out_dir).summary() if (out_dir / "config.json").is_file() else None
    if summary is None:
        return False
    when = f" at {summary['timestamp']}" if summary.get("timestamp") else ""
    click.echo(
        f"{out_dir}: the run is already complete ({summary.get('steps_done')} steps, finished"
        f"{when}); nothing to resume, its summary follows",
        err=True,
    )
    return True


def given_values(cfg: CommonConfig, values: dict[str, Any]) -> dict[str, Any]:
    """The values of the config keys the command line (or its config file) gave, validated."""
    dump = cfg.model_dump()
    return {k: dump[k] for k in values if k in dump}


def holds_run(out_dir: Path, given: dict[str, Any]) -> bool:
    """Whether ``out_dir`` holds a run to resume for ``--resume-if-exists``: one that recorded
    a metrics row (a directory cut off before its first row, or empty, starts afresh). A run
    started with other options is refused, named (resuming it would ignore them)."""
    records = RunRecords(out_dir)
    if not records.metrics_path.exists():
        return False
    loop.check_same_run(records.config(), given, out_dir)
    return True


run = click.Command(
    "run",
    params=_run_params(),
    callback=_run,
    help=(
        "Train ALGORITHM and record metrics and privacy spent. `privdl algorithms` lists the "
        "algorithms and what each is; federated algorithms take --clients instead of a graph "
        "(steps are rounds)."
    ),
)


@click.command("algorithms")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_algorithms(as_json: bool) -> None:
    """The algorithms privdl can run (the registry): name, family, options of its family."""
    rows = []
    for name, entry in algorithms().items():
        model = entry.recipe.config_model
        own = [k for k in model.model_fields if k not in CommonConfig.model_fields]
        rows.append(
            {
                "name": name,
                "recipe": type(entry.recipe).__name__,
                "description": entry.description,
                "options": own,
                "origin": entry.origin,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['name']:<12} {r['recipe']:<16} {r['description']}")


def _run_seeds(
    cfg: CommonConfig,
    seeds: list[int],
    out_dir: Path,
    progress: bool | None,
    *,
    overwrite: bool = False,
    resume_existing: bool = False,
) -> None:
    """Train ``cfg`` once per seed into ``out_dir/seed-K`` (resuming the runs that exist when
    ``resume_existing``), then the mean ± std table."""
    if resume_existing:  # every seed run of one configuration, checked before any resumes
        existing = [out_dir / f"seed-{s}" for s in seeds]
        refuse_mixed_sweep(
            [d for d in existing if (d / "config.json").is_file()], cfg, seeds_plan_given(out_dir)
        )
    dirs = []
    for seed in seeds:
        d = out_dir / f"seed-{seed}"
        if resume_existing and (d / "config.json").is_file():
            loop.resume(d, progress=progress)
        else:
            loop.train(cfg.with_updates(seed=seed), d, progress=progress, overwrite=overwrite)
        dirs.append(d)
    _print_repeats(dirs, out_dir)


#: What differs between the runs of one sweep (the seed keys of privdl.report).
_SWEEP_VARIES = ("seed",)


def refuse_mixed_sweep(
    dirs: list[Path], plan: CommonConfig | None, given: list[str] | None
) -> None:
    """Refuse to resume the seed runs of a sweep that do not share one configuration (each
    other's, and the sweep plan's on the keys its command line gave): resuming would mix them
    in one mean ± std table. A run's own config is compared after validation (its calibrated
    noise levels included)."""
    configs = [(d, make_config(RunRecords(d).config(), saved=True).model_dump()) for d in dirs]
    want = plan.model_dump() if plan is not None else None
    for d, c in configs:
        if want is not None and given is not None:
            differ = [k for k in given if k not in _SWEEP_VARIES and c.get(k) != want.get(k)]
            if differ:
                k = differ[0]
                raise ConfigError(
                    f"{d} was run with {k}={c.get(k)!r} but the sweep in {d.parent} with "
                    f"{k}={want.get(k)!r}: its seed runs mix configurations; resume refused "
                    "(move the odd runs away, or start the sweep again with --overwrite)"
                )
        d0, c0 = configs[0]
        differ = [k for k in c0 if k not in _SWEEP_VARIES and c.get(k) != c0.get(k)]
        if differ:
            k = differ[0]
            raise ConfigError(
                f"{d} was run with {k}={c.get(k)!r} but {d0} with {k}={c0.get(k)!r}: the seed "
                f"runs in {d.parent} mix configurations; resume refused (move the odd runs "
                "away, or start the sweep again with --overwrite)"
            )


def refuse_options_with_resume(
    algorithm, config_file, sets, out, seeds, overwrite, flags: dict
) -> None:
    """``--resume DIR`` continues the run as it was configured: any other run option would be
    silently ignored, so it is an error, named."""
    given = [f"--{f.replace('_', '-')}" for f in _FLAGS if flags.get(f) is not None]
    given += [name for name, v in (("--config", config_file), ("--set", sets), ("--out", out),
              ("--seeds", seeds), ("--overwrite", overwrite)) if v]  # fmt: skip
    if algorithm:
        given.insert(0, f"the algorithm {algorithm!r}")
    if given:
        raise ConfigError(
            f"--resume continues a run with its saved config; drop {', '.join(given)} "
            "(or start a new run with --out)"
        )


#: The most seeds one ``--seeds`` sweep may name: each is a full run (and a directory), so a
#: larger sweep is a typo (``0-10000000``); it is refused before anything is written.
MAX_SEEDS = 10_000


def parse_seeds(text: str) -> list[int]:
    """``1,2,3`` or ``1-5`` (or a mix, ``1-3,7``) into distinct seeds, in order; at most
    :data:`MAX_SEEDS` (a range is counted before it is expanded)."""
    seeds: dict[int, None] = {}  # ordered and O(1) membership
    named = 0
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ConfigError(f"--seeds {_short(text)}: expected e.g. 1,2,3 or 1-5") from None
        named += max(0, last - first + 1)
        if named > MAX_SEEDS:
            raise ConfigError(
                f"--seeds {_short(text)} names more than {MAX_SEEDS} seeds (each is a full "
                f"run); at most {MAX_SEEDS} per sweep"
            )
        seeds.update(dict.fromkeys(range(first, last + 1)))
    if not seeds or any(s < 0 for s in seeds):
        raise ConfigError(f"--seeds {_short(text)}: expected non-negative seeds, e.g. 1,2,3 or 1-5")
    return list(seeds)


def _short(text: str, limit: int = 60) -> str:
    """``text`` quoted, cut to ``limit`` characters (an error line stays one short line)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _print_repeats(dirs: list[Path], out_dir: Path) -> None:
    # heavy: imported when the command runs
    from privdl.report import load_runs, markdown_table, write_report

    runs = load_runs(dirs)
    path = write_report(runs, out_dir)
    click.echo(markdown_table(runs))
    click.echo(f"records: {out_dir}/seed-*; report: {path}")


def _span(values: list[float]) -> str:
    """``lo..hi`` of ``values`` (one number when they are all equal)."""
    lo, hi = f"{min(values):.4g}", f"{max(values):.4g}"
    return lo if lo == hi else f"{lo}..{hi}"


def _print_summary(summary: dict, out_dir: Path) -> None:
    # heavy: imported when the command runs
    from privdl.report import privacy_text

    final = summary.get("final", {})
    shown = {k: v for k, v in final.items() if isinstance(v, float | int) and k != "wall_time"}
    click.echo(
        " ".join(f"{k}={v:.5g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())
    )
    click.echo(f"privacy: {privacy_text(final.get('privacy'))}")
    cfg = summary.get("config") or {}
    federated = cfg.get("graph") == "server"
    priv = final.get("privacy") or {}
    # launched with the seed's keys (or resumed from such a run): every rank knows the seed
    shared = summary.get("distributed") or (federated and priv.get("threat_model") != "server")
    if priv and cfg.get("key_source", "seed") == "seed" and shared:
        insider = "the server" if federated else "the nodes"
        click.echo(
            f"noise: from --seed, which every rank knows ({insider} among them, who can rebuild "
            "it): the epsilon holds only against an eavesdropper who does not know the seed, "
            f"not against {insider}; --key-source os keeps each "
            f"{'client' if federated else 'node'}'s keys with its rank"
        )
    elif priv and cfg.get("key_source", "seed") == "seed":
        # as Opacus without secure_mode: fine for experiments, not for deployment
        click.echo(
            "noise: drawn from --seed's generator (a reproducible simulation: whoever knows the "
            "seed can rebuild it); --key-source os seeds it from the OS"
            if federated
            else "keys: derived from --seed (a reproducible simulation: whoever knows the seed "
            "can rebuild the noise and the batches drawn); --key-source os draws them from the OS"
        )
    if final.get("client_epsilons"):
        eps, b = final["client_epsilons"], final.get("privacy") or {}
        tail = (
            f" (each client's, delta={b['delta']:.3g}, {b['accountant']}, {b['threat_model']}, "
            f"{b['unit']}-level, {b['neighbouring']})"
            if {"delta", "accountant", "threat_model", "unit", "neighbouring"} <= set(b)
            else ""
        )
        click.echo(f"clients' epsilons{tail}: {', '.join(f'{e:.4g}' for e in eps)}")
    cal = summary.get("calibration") or {}
    if cal.get("clients"):
        z = [c["noise_multiplier"] for c in cal["clients"]]
        ref = [c["noise_multiplier_nominal"] for c in cal["clients"]]
        click.echo(
            f"noise multipliers z_i (rdp): {_span(z)} "
            f"(the Robust-HDP code's, NOMINAL: {_span(ref)})"
        )
    for key, entry in cal.items():
        if isinstance(entry, dict) and "sigma" in entry:
            tag = "NOMINAL, " if entry.get("nominal") else ""
            click.echo(f"sigma ({key}, {tag}{entry.get('accountant')}): {entry['sigma']:.6g}")
    click.echo(f"records: {out_dir}")


@click.command("demo")
@click.option(
    "--out",
    type=click.Path(),
    default="runs/demo",
    show_default=True,
    help="Directory of the runs (OUT/METHOD) and of report.md.",
)
@click.option("--steps", type=int, default=400, show_default=True, help="Steps of every run (T).")
@click.option(
    "--epsilon",
    type=float,
    default=10.0,
    show_default=True,
    help="Privacy target of the private runs (delta = 1e-5, user-level).",
)
@click.option("--graph", default="ring:16", show_default=True, help="Graph of the DECOR/LDP runs.")
@click.option(
    "--seeds", type=int, default=1, show_default=True, help="Repeat each method over seeds 1..K."
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help=PROGRESS_HELP,
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the records of an earlier demo in --out.",
)
@click.option(
    "--accountant",
    type=click.Choice(["tightest", "rdp"]),
    default="tightest",
    show_default=True,
    help="tightest: the exact Gaussian (mu-GDP) epsilon; rdp: privdl 0.1's RDP with the classic "
    "conversion (more noise for the same epsilon), for comparison.",
)
def demo(
    out: str,
    steps: int,
    epsilon: float,
    graph: str,
    seeds: int,
    progress,
    overwrite: bool,
    accountant: str,
) -> None:
    """The main job: private vs non-private decentralized learning on a9a over ring:16."""
    # heavy: imported when the command runs (the report layer)
    from privdl.cli.demo import run_demo

    table, report = run_demo(
        Path(out),
        steps=steps,
        epsilon=epsilon,
        graph=graph,
        seeds=seeds,
        progress=progress,
        overwrite=overwrite,
        accountant=accountant,
    )
    click.echo(table)
    click.echo(f"\nreport: {report}")


@click.command("report")
@click.argument("dirs", nargs=-1, required=True, type=click.Path())
@click.option(
    "--out",
    type=click.Path(),
    default="report",
    show_default=True,
    help="Directory of report.md, the PNG plots (and metrics.csv).",
)
@click.option(
    "--group/--per-run",
    default=True,
    help=with_default(
        "Merge runs that differ only in seed/data_seed: mean ± std, or a row each.", "--group"
    ),
)
@click.option(
    "--csv",
    "as_csv",
    is_flag=True,
    help="Also write OUT/metrics.csv: every run's metrics rows, one line each, with flattened "
    "columns (privacy.epsilon, ...) and the run's directory and label (docs/records.md).",
)
def report(dirs: tuple[str, ...], out: str, group: bool, as_csv: bool) -> None:
    """Make a markdown table and PNG plots (and a CSV) from one or several run directories."""
    # heavy: imported when the command runs
    from privdl.report import CSV_FILE, make_report

    path = make_report(list(dirs), out, group=group, csv=as_csv)
    click.echo(path.read_text())
    click.echo(f"written: {path}" + (f", {path.parent / CSV_FILE}" if as_csv else ""))
