"""``privdl audit ALGORITHM [run options]``: an empirical lower bound on epsilon beside the
accounted one (:func:`privdl.audit.audit`).

It takes the run's own options (``privdl run``'s), calibrates the noise as a run would, runs the
mechanism as implemented on neighbouring inputs and prints both bounds with their labels. The exit
code is 0 when the lower bound stays at or under the accounted epsilon, 1 when it exceeds it (the
code does not deliver its accountant's guarantee), 2 for bad input.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from privdl.cli.run import _OPTIONS, AlgorithmName, command_line_values

#: Exit code of an audit whose lower bound exceeds the accounted epsilon.
FOUND = 1


def _text(r: Any) -> str:
    acc = r.accounted
    mu = acc.get("mu")
    label = (
        f"{acc.get('accountant')}, delta {r.delta:g}, {acc.get('neighbouring')}, "
        f"unit {acc.get('unit')}, threat model {acc.get('threat_model')}"
        + (f", mu {mu:.4g}" if isinstance(mu, float) else "")
    )
    verdict = "yes" if r.within_accounted else "NO: the implementation exceeds its accountant"
    game = r.one_run
    size = (
        f"one run, {game['canaries']} canaries ({game['included']} included"
        + (
            f"; {game['reference']} reference canaries fit the test)"
            if "reference" in game
            else ")"
        )
        if game
        else f"{r.trials} trials"
    )
    lower = (
        f"  lower      epsilon {r.epsilon_lower:.4g} (one-run: {game['correct']} of "
        f"{game['guesses']} guesses right, best of {game['candidates']} guess counts)"
        if game
        else f"  lower      epsilon {r.epsilon_lower:.4g} (clopper-pearson, no assumption)"
    )
    return "\n".join(
        [
            f"audit of {r.algorithm} ({r.threat_model}): {size}, "
            f"{r.confidence:.0%} confidence, {r.seconds:.2f} s",
            f"  accounted  epsilon {r.epsilon_accounted:.4g} ({label})",
            lower,
            (
                f"             epsilon {r.epsilon_lower_gdp:.4g} (gdp: assumes mu-GDP; "
                f"mu >= {r.mu_lower:.4g})"
                if r.epsilon_lower_gdp == r.epsilon_lower_gdp  # not NaN
                else "             (no gdp bound: a one-run audit certifies with its own bound)"
                if game
                else "             (no gdp bound: the view mixes over secret sampling, not mu-GDP)"
            ),
            *([f"  score: {game['score']}"] if game else []),
            f"  test: {r.test}",
            f"  within the accounted bound: {verdict}",
            f"  canary: {r.canary['kind']}"
            + (f" at node {r.canary['node']}" if "node" in r.canary else "")
            + (f", rate {r.canary['sampling_rate']:.4g}" if "sampling_rate" in r.canary else "")
            + f", C = {r.canary['size']:g}",
            f"  adversary sees: {r.view}",
        ]
    )


def _audit(algorithm, config_file, sets, trials, threat_model, confidence, batch, sampling_rate,
           one_run, canaries, black_box, known_position, canary_model, input_canaries, as_json,
           plot, suite, out, overwrite, suite_kinds, **flags):  # fmt: skip
    from privdl.audit import audit

    seed = flags.pop("seed", None)
    if suite:
        if one_run or black_box or known_position or input_canaries or canary_model != "linear":
            raise click.UsageError(
                "--suite runs its own preset: no --one-run, --black-box, --known-position, "
                "--input-canaries or --canary-model (choose its audits with --suite-kinds)"
            )
        _suite(algorithm, config_file, sets, flags, out, overwrite, trials, confidence, seed,
               suite_kinds)  # fmt: skip
        return
    if suite_kinds is not None:
        raise click.UsageError("--suite-kinds chooses the audits of --suite: give --suite")
    if canaries is not None and not one_run:
        raise click.UsageError("--canaries counts the canaries of --one-run: give --one-run")
    values = command_line_values(config_file, algorithm, flags, sets)
    name = values.pop("algorithm", None)
    if name is None:
        raise click.UsageError("name the ALGORITHM to audit")
    result = audit(
        name,
        trials=trials,
        threat_model=threat_model,
        confidence=confidence,
        seed=int(seed or 0),
        batch=batch,
        sampling_rate=sampling_rate,
        one_run=one_run,
        canaries=canaries or 1000,
        black_box=black_box,
        known_position=known_position,
        canary_model=canary_model,
        input_canaries=input_canaries,
        **values,
    )
    if plot:
        from privdl.audit.plot import tradeoff_figure

        tradeoff_figure(result, plot)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(_text(result))
        if plot:
            click.echo(f"  figure: {plot}")
    if not result.within_accounted:
        sys.exit(FOUND)


def _suite(algorithm, config_file, sets, flags, out, overwrite, trials, confidence, seed,
           kinds) -> None:  # fmt: skip
    from pathlib import Path

    from privdl.audit.suite import run_suite

    if algorithm or config_file or sets or any(v is not None for v in flags.values()):
        raise click.UsageError("--suite runs its own preset: give no algorithm or run options")
    if not out:
        raise click.UsageError("--suite writes a report: give --out DIR")
    chosen = None if kinds is None else tuple(k.strip() for k in kinds.split(",") if k.strip())
    results = run_suite(Path(out), scale=trials / 20_000, confidence=confidence,
                        seed=int(seed or 0), overwrite=overwrite, kinds=chosen)  # fmt: skip
    report = (Path(out) / "report.md").read_text(encoding="utf-8").splitlines()
    click.echo("\n".join(line for line in report if line.startswith("|")))
    click.echo(f"report: {Path(out) / 'report.md'}")
    if not all(r.within_accounted for r in results):
        sys.exit(FOUND)


audit = click.Command(
    "audit",
    params=[
        click.Argument(["algorithm"], required=False, type=AlgorithmName()),
        click.Option(["--config", "config_file"], type=click.Path(), help="TOML config file."),
        *_OPTIONS.values(),
        click.Option(["--set", "sets"], multiple=True, help="Any config key: --set KEY=VALUE."),
        click.Option(
            ["--trials"],
            type=click.IntRange(16),
            default=20_000,
            show_default=True,
            help="Trials in all: half fit the adversary's test, half certify.",
        ),
        click.Option(
            ["--threat-model"],
            default=None,
            help="DECOR: eavesdropper, curious or collusion:Q; ldp and cdp/dpsgd have "
            "their own (ldp, central).",
        ),
        click.Option(
            ["--confidence"],
            type=click.FloatRange(0, 1, min_open=True, max_open=True),
            default=0.95,
            show_default=True,
            help="Confidence of the lower bounds.",
        ),
        click.Option(
            ["--batch"],
            type=click.IntRange(2),
            default=None,
            help="Trials per run of the mechanism (memory; default 50000 gradient canaries, "
            "20000 PrivSGP gradient canaries, 4000 canary examples and PrivSGP input canaries).",
        ),
        click.Option(
            ["--sampling-rate"],
            type=click.FloatRange(0, 1, min_open=True),
            default=0.05,
            show_default=True,
            help="Example level (dpsgd, decor, ldp, cdp, porter-dp --sampling poisson): each "
            "canary example's inclusion rate.",
        ),
        click.Option(
            ["--one-run"],
            is_flag=True,
            help="Audit one run on --canaries canaries, each included (or, for gradient "
            "canaries, signed) with probability 1/2 (Steinke, Nasr and Jagielski 2023): the "
            "gossip family (decor, ldp, cdp, dpsgd, porter-dp), dpsgd --sampling poisson and the "
            "federated clients.",
        ),
        click.Option(
            ["--canaries"],
            type=click.IntRange(10),
            default=None,
            help="--one-run: canaries in the run (default 1000; canary examples at most 7000).",
        ),
        click.Option(
            ["--black-box"],
            is_flag=True,
            help="Input canaries (dpsgd, decor, ldp, cdp, porter-dp with --sampling poisson; "
            "privsgp, privsgp-vr): the adversary sees the final model(s) only (its score is the "
            "canary's loss).",
        ),
        click.Option(
            ["--input-canaries"],
            is_flag=True,
            help="privsgp, privsgp-vr: a canary example in node 0's data (in a block of "
            "--block-size examples, 16 unless given; 4 blocks a node), through the run's own "
            "sample oracle, instead of a gradient canary; the adversary sees node 0's messages "
            "(--black-box: the final models).",
        ),
        click.Option(
            ["--known-position"],
            is_flag=True,
            help="dpsgd --sampling poisson: the canaries lead the data order (the rest all-zero "
            "examples), so a sampler that walks the data in order shows them at known steps.",
        ),
        click.Option(
            ["--canary-model"],
            type=click.Choice(["linear", "cnn"]),
            default="linear",
            show_default=True,
            help="Input canaries: one linear-model coordinate each, or mislabelled images in a "
            "shared CNN (with --one-run --black-box).",
        ),
        click.Option(["--json", "as_json"], is_flag=True, help="Machine-readable output."),
        click.Option(
            ["--suite"],
            is_flag=True,
            help="Audit every algorithm and threat model (the audit-suite preset) and write a "
            "report with --out; --trials 20000 is the preset's size (others scale it).",
        ),
        click.Option(
            ["--suite-kinds"],
            default=None,
            help="--suite: the kinds of audit to run, comma-separated, of multi-run, "
            "example, one-run, known-position, privsgp, cnn (default: all but cnn).",
        ),
        click.Option(["--out"], type=click.Path(file_okay=False), help="--suite: report folder."),
        click.Option(["--overwrite"], is_flag=True, help="--suite: replace a report in --out."),
        click.Option(
            ["--plot"],
            type=click.Path(dir_okay=False),
            help="Write the trade-off figure (observed tests against the accountant's "
            "curve) to this PNG.",
        ),
    ],  # fmt: skip
    callback=_audit,
    help=(
        "Audit ALGORITHM as implemented: run its mechanism on neighbouring inputs (a white-box "
        "gradient canary, or input canaries: --sampling poisson, --input-canaries) and certify a lower bound on epsilon beside the accounted upper bound. "
        "Takes privdl run's options (the noise is calibrated to --epsilon as a run would). "
        "Exit code 1 when the lower bound exceeds the accounted epsilon."
    ),
)
