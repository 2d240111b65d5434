"""``privdl run`` (one configured run), ``privdl demo`` (the README's main job)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from privdl.config import ALGORITHMS, RunConfig, load_config_file, make_config
from privdl.errors import ConfigError

#: CLI flag -> config key for the options offered directly (others through --set KEY=VALUE).
_FLAGS = {
    "task": "task",
    "model": "model",
    "graph": "graph",
    "mixing": "mixing",
    "steps": "steps",
    "lr": "lr",
    "lr_decay": "lr_decay",
    "batch_size": "batch_size",
    "sampling": "sampling",
    "clip": "clip",
    "clip_mode": "clip_mode",
    "sigma": "sigma",
    "sigma_cor": "sigma_cor",
    "weight_decay": "weight_decay",
    "partition": "partition",
    "seed": "seed",
    "eval_every": "eval_every",
    "device": "device",
    "dtype": "dtype",
    "data_dir": "data_dir",
    "epsilon": "epsilon",
    "delta": "delta",
    "adversary": "adversary",
    "label": "label",
    "compressor": "compressor",
    "gamma": "gamma",
    "block_size": "block_size",
    "noise_backend": "noise_backend",
    "key_source": "key_source",
    "clients": "clients",
    "budgets": "budgets",
    "local_epochs": "local_epochs",
    "clients_per_round": "clients_per_round",
}


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
        if key not in RunConfig.model_fields:
            raise ConfigError(f"unknown config key {key!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@click.command("run")
@click.argument("algorithm", required=False, type=click.Choice(ALGORITHMS))
@click.option("--config", "config_file", type=click.Path(), help="TOML config file.")
@click.option("--task", help="least-squares, a9a, mnist, fashion-mnist, cifar10, synthetic-cifar10")
@click.option(
    "--model", help="Model name (default per task), or your nn.Module as package.module:Name."
)
@click.option(
    "--graph",
    help="Graph spec, e.g. ring:16, torus:4x4, an edge-list file, or expo:N (PrivSGP only).",
)
@click.option(
    "--mixing",
    help="decor, metropolis, max-degree, average, fdla, best-constant (default: fdla for PORTER "
    "up to 256 nodes, best-constant above; metropolis otherwise).",
)
@click.option("--steps", type=int)
@click.option("--lr", type=float)
@click.option("--lr-decay", type=float, help="eta_t = lr/(1 + t/DECAY).")
@click.option("--batch-size", type=int)
@click.option("--sampling", help="without_replacement, poisson or full.")
@click.option("--clip", type=float, help="Clipping threshold C.")
@click.option("--clip-mode", help="per_sample, batch_mean or none.")
@click.option(
    "--sigma", type=float, help="Gaussian noise std (LDP/CDP/DECOR sigma, PORTER sigma_p, PrivSGP)."
)
@click.option("--sigma-cor", type=float, help="Correlated noise std (DECOR).")
@click.option("--weight-decay", type=float)
@click.option("--partition", help="iid, dirichlet:ALPHA or shards:K.")
@click.option("--seed", type=int)
@click.option("--eval-every", type=int)
@click.option("--device", help="cpu or cuda.")
@click.option("--dtype", help="float32 or float64.")
@click.option("--data-dir", help="Where dataset files are looked up first.")
@click.option("--epsilon", type=float, help="Target epsilon: the noise is calibrated to it.")
@click.option("--delta", type=float)
@click.option("--adversary", help="eavesdropper, curious, collusion:Q or ldp (DECOR).")
@click.option("--label", help="A name for the run in reports.")
@click.option(
    "--compressor",
    help="PORTER compressor: none, randk:F (alias random:F), urandk:F, bernk:F, topk:F, qsgd:L.",
)
@click.option("--gamma", type=float, help="PORTER consensus step size gamma in (0, 1].")
@click.option("--block-size", type=int, help="PrivSGP-VR samples per SAGA table entry.")
@click.option(
    "--noise-backend",
    help="Keyed Gaussian streams: auto (aes-ziggurat on CPU, chacha20 on CUDA), aes-ziggurat, "
    "chacha20 or torch (docs/secrets.md).",
)
@click.option(
    "--key-source",
    help="seed (default: noise keys and DECOR's key pairs derived from --seed, a reproducible "
    "simulation) or os (operating-system randomness; kept only in the checkpoint, under "
    "privdl launch in OUT/keys/rank-R.pt).",
)
@click.option("--clients", type=int, help="Federated: number of clients (default 20).")
@click.option(
    "--budgets",
    help="Federated: each client's epsilon, Dist1..Dist9 (the Robust-HDP paper's lists) or a "
    "comma list (one value: every client).",
)
@click.option("--local-epochs", type=int, help="Federated: local epochs K per round (default 1).")
@click.option("--clients-per-round", type=int, help="Federated: clients sampled per round.")
@click.option("--set", "sets", multiple=True, help="Any config key: --set KEY=VALUE.")
@click.option("--out", type=click.Path(), help="Output directory (default runs/<algorithm>).")
@click.option(
    "--seeds",
    help="Repeat over seeds, e.g. 1,2,3 or 1-5: runs in OUT/seed-K, then a mean ± std table.",
)
@click.option(
    "--resume", "resume_dir", type=click.Path(), help="Continue the run (or the seed runs) in DIR."
)
@click.option("--overwrite", is_flag=True, help="Replace an earlier run in --out.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: if a tty).")
def run(algorithm, config_file, sets, out, seeds, resume_dir, overwrite, progress, **flags) -> None:
    """Train ALGORITHM and record metrics and privacy spent.

    ALGORITHM: dsgd, ldp, cdp, decor (DECOR), porter-dp, porter-gc (PORTER), privsgp,
    privsgp-vr (PrivSGP-VR; also on expo:N with push-sum); federated, with a server and
    --clients instead of a graph (steps are rounds): robust-hdp (Robust-HDP), weiavg, pfa,
    dpfedavg (the Robust-HDP paper's baseline: example-level DP-SGD on each client), mineps,
    fedavg.
    """
    from privdl.records import (
        SEEDS_PLAN,
        make_dir,
        read_seeds_plan,
        seed_run_dirs,
        write_seeds_plan,
    )
    from privdl.runner import resume

    if resume_dir:
        refuse_options_with_resume(algorithm, config_file, sets, out, seeds, overwrite, flags)
        parent = Path(resume_dir)
        plan = None if (parent / "config.json").is_file() else read_seeds_plan(parent)
        if plan is not None:  # every seed of the sweep: the cut-off ones and those not started
            _run_seeds(make_config(plan[1]), plan[0], parent, progress, resume_existing=True)
            return
        dirs = seed_run_dirs(resume_dir)
        if (parent / "config.json").is_file() or not dirs:
            summary = resume(resume_dir, progress=progress)
            _print_summary(summary, parent)
            return
        for d in dirs:
            resume(d, progress=progress)
        _print_repeats(dirs, parent)
        return
    values = command_line_values(config_file, algorithm, flags, sets)
    cfg = make_config(values)
    out_dir = Path(out or f"runs/{cfg.algorithm}")
    if seeds is None:
        from privdl.runner import train

        summary = train(cfg, out_dir, progress=progress, overwrite=overwrite)
        _print_summary(summary, out_dir)
        return
    if "seed" in values:
        raise ConfigError("give --seed or --seeds, not both")
    seed_list = parse_seeds(seeds)
    if (out_dir / SEEDS_PLAN).exists() and not overwrite:
        raise ConfigError(
            f"{out_dir} already holds a --seeds sweep; use --resume {out_dir} to continue it, "
            "or choose another --out (or --overwrite)"
        )
    make_dir(out_dir)
    write_seeds_plan(out_dir, seed_list, cfg.model_dump())
    _run_seeds(cfg, seed_list, out_dir, progress, overwrite=overwrite)


def _run_seeds(
    cfg: RunConfig,
    seeds: list[int],
    out_dir: Path,
    progress: bool | None,
    *,
    overwrite: bool = False,
    resume_existing: bool = False,
) -> None:
    """Train ``cfg`` once per seed into ``out_dir/seed-K`` (resuming the runs that exist when
    ``resume_existing``), then the mean ± std table."""
    from privdl.runner import resume, train

    dirs = []
    for seed in seeds:
        d = out_dir / f"seed-{seed}"
        if resume_existing and (d / "config.json").is_file():
            resume(d, progress=progress)
        else:
            train(cfg.with_updates(seed=seed), d, progress=progress, overwrite=overwrite)
        dirs.append(d)
    _print_repeats(dirs, out_dir)


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


def parse_seeds(text: str) -> list[int]:
    """``1,2,3`` or ``1-5`` (or a mix, ``1-3,7``) into distinct seeds, in order."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            span = range(int(lo), int(hi) + 1) if dash else [int(lo)]
            seeds.extend(s for s in span if s not in seeds)
    except ValueError:
        raise ConfigError(f"--seeds {text!r}: expected e.g. 1,2,3 or 1-5") from None
    if not seeds or any(s < 0 for s in seeds):
        raise ConfigError(f"--seeds {text!r}: expected non-negative seeds, e.g. 1,2,3 or 1-5")
    return seeds


def _print_repeats(dirs: list[Path], out_dir: Path) -> None:
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
    from privdl.report import privacy_text

    final = summary.get("final", {})
    shown = {k: v for k, v in final.items() if isinstance(v, float | int) and k != "wall_time"}
    click.echo(
        " ".join(f"{k}={v:.5g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())
    )
    click.echo(f"privacy: {privacy_text(final.get('privacy'))}")
    cfg = summary.get("config") or {}
    if final.get("privacy") and cfg.get("key_source", "seed") == "seed":
        # as Opacus without secure_mode: fine for experiments, not for deployment
        click.echo(
            "noise: drawn from --seed's generator (a reproducible simulation: whoever knows the "
            "seed can rebuild it); --key-source os seeds it from the OS"
            if cfg.get("graph") == "server"
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
@click.option("--out", type=click.Path(), default="runs/demo", show_default=True)
@click.option("--steps", type=int, default=400, show_default=True)
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
@click.option("--progress/--no-progress", default=None)
@click.option("--overwrite", is_flag=True, help="Replace the records of an earlier demo in --out.")
def demo(
    out: str, steps: int, epsilon: float, graph: str, seeds: int, progress, overwrite: bool
) -> None:
    """The main job: private vs non-private decentralized learning on a9a over ring:16."""
    from privdl.demo import run_demo

    table, report = run_demo(
        Path(out),
        steps=steps,
        epsilon=epsilon,
        graph=graph,
        seeds=seeds,
        progress=progress,
        overwrite=overwrite,
    )
    click.echo(table)
    click.echo(f"\nreport: {report}")


@click.command("report")
@click.argument("dirs", nargs=-1, required=True, type=click.Path())
@click.option("--out", type=click.Path(), default="report", show_default=True)
@click.option(
    "--group/--per-run",
    default=True,
    help="Merge runs that differ only in seed/data_seed: mean ± std (default), or a row each.",
)
def report(dirs: tuple[str, ...], out: str, group: bool) -> None:
    """Make a markdown table and PNG plots from one or several run directories."""
    from privdl.report import make_report

    path = make_report(list(dirs), out, group=group)
    click.echo(path.read_text())
    click.echo(f"written: {path}")
