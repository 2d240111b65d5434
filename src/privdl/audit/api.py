"""``privdl.audit.audit``: an empirical lower bound on epsilon beside the accountant's upper bound.

One call builds the run exactly as ``privdl run`` would from the same options (the noise
calibrated to ``epsilon`` by the run's accountant), runs its mechanism on neighbouring inputs in
``trials`` seeded trials (:mod:`privdl.audit.gossip`), fits the adversary's test on half of them
and certifies on the other half, with Clopper-Pearson confidence limits (assumption-free) and,
beside it, the bound that assumes the mechanism is mu-GDP (Nasr et al. 2023; every Gaussian
mechanism and composition is). A correct implementation gives ``epsilon_lower <=
epsilon_accounted`` with probability at least ``confidence``; a lower bound above the accounted
epsilon shows that the code does not deliver what its accountant certifies.

``one_run=True`` audits instead *one* run on ``canaries`` canaries, certified by the one-run
bound of Steinke, Nasr and Jagielski 2023 (:mod:`privdl.audit.one_run_audit`): canary examples
each included with probability 1/2 (DP-SGD with Poisson sampling, federated clients), or
gradient canaries each signed +-C with probability 1/2 (the gossip family, user level).
``black_box=True`` (DP-SGD) shows the adversary only the final model: its score is the canary's
loss.

PrivSGP and PrivSGP-VR take input canaries with ``input_canaries=True`` (or ``black_box=True``):
a canary example in node 0's data, through the run's own sample oracle, each trial its own copy
of the network (:func:`privdl.audit.privsgp.privsgp_input_views`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from privdl.audit.estimators import empirical_tradeoff, epsilon_lower_bound_heldout
from privdl.audit.examples import (
    build_example_run,
    canary_losses,
    example_views,
    gossip_canary_losses,
)
from privdl.audit.federated import build_client_run, client_budget, client_views
from privdl.audit.gossip import batches, canary_views, gossip_view, public_signs
from privdl.audit.privsgp import build_privsgp_input_run, privsgp_input_views, privsgp_views
from privdl.audit.scores import fit_linear_test, fit_mixture_test, fit_scan_test
from privdl.engine.threads import one_thread
from privdl.errors import ConfigError
from privdl.registry import make_config

__all__ = ["AUDITED", "AuditResult", "audit", "audit_config"]

#: The algorithms ``privdl audit`` runs, and the threat model each is accounted against.
AUDITED = {
    "decor": "eavesdropper, curious or collusion:Q (--threat-model)",
    "ldp": "ldp",
    "cdp": "central",
    "dpsgd": "central",
    "porter-dp": "ldp",
    "privsgp": "ldp",
    "privsgp-vr": "ldp",
    "robust-hdp": "server",
    "dpfedavg": "server",
    "weiavg": "server",
    "pfa": "server",
    "mineps": "server",
}
#: PrivSGP-VR (Algorithm 1) and PrivSGP (Algorithm 2, no SAGA table): a canary sample.
PRIVSGP = ("privsgp", "privsgp-vr")
#: The federated algorithms among them: one client's local DP-SGD, seen by the server.
FEDERATED = ("robust-hdp", "dpfedavg", "weiavg", "pfa", "mineps")

#: Example-level audits (dpsgd with sampling poisson, and every federated client): DP-SGD on
#: canary examples, a small step size so each canary's gradient stays clipped
#: (:mod:`privdl.audit.examples`).
EXAMPLE_DEFAULTS: dict[str, Any] = {
    "clip": 1.0,
    "clip_mode": "per_sample",
    "steps": 10,
    "lr": 1e-3,
}

#: PrivSGP(-VR) input canaries (:func:`privdl.audit.privsgp.build_privsgp_input_run`): the
#: canary example in a block of 16 (J = 4 blocks a node), a small step size so its gradient
#: stays clipped.
PRIVSGP_INPUT_DEFAULTS: dict[str, Any] = {**EXAMPLE_DEFAULTS, "block_size": 16}

#: What an audit changes in a run's defaults: a small synthetic task (the canary oracle replaces
#: its data; every node takes its full local gradient: user-level privacy), C = 1, a few steps.
AUDIT_DEFAULTS: dict[str, Any] = {
    "task": "least-squares",
    "clip": 1.0,
    "clip_mode": "batch_mean",
    "steps": 10,
    "lr": 0.1,
}


@dataclass(frozen=True)
class AuditResult:
    """An audit's outcome (module docstring); ``to_dict`` is the ``--json`` output."""

    algorithm: str
    threat_model: str
    trials: int
    confidence: float
    delta: float
    #: Clopper-Pearson lower bound (no assumption on the mechanism)
    epsilon_lower: float
    #: the bound assuming the mechanism is mu-GDP, and its mu (NaN where it is not: a view that
    #: mixes over secret sampling - Poisson minibatches, PrivSGP's drawn entry - is not mu-GDP
    #: for a mu that matches its tails)
    epsilon_lower_gdp: float
    mu_lower: float
    epsilon_accounted: float
    #: the accountant's labelled budget (accountant, neighbouring, unit, threat model, mu)
    accounted: dict[str, Any]
    canary: dict[str, Any]
    view: str
    #: the adversary's test that certified: ``fisher`` (linear) or ``scan`` (max over features)
    test: str
    settings: dict[str, Any]
    #: observed (FPR, FNR) of the fitted test on the certifying trials
    tradeoff: list[tuple[float, float]] = field(repr=False)
    seconds: float = 0.0
    #: one-run audits: the game (canaries, guesses, correct, k_plus, k_minus, candidates, score)
    one_run: dict[str, Any] | None = None

    @property
    def within_accounted(self) -> bool:
        """Whether both lower bounds are at most the accounted epsilon (what a correct
        implementation shows with probability >= ``confidence``)."""
        gdp = 0.0 if math.isnan(self.epsilon_lower_gdp) else self.epsilon_lower_gdp
        return max(self.epsilon_lower, gdp) <= self.epsilon_accounted

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (NaN, where a bound does not apply, as null)."""
        out = {k: (None if isinstance(v, float) and math.isnan(v) else v)
               for k, v in asdict(self).items()}  # fmt: skip
        out["tradeoff"] = [list(p) for p in self.tradeoff]
        out["within_accounted"] = self.within_accounted
        return out


def audit_config(algorithm: str, options: dict[str, Any], threat_model: str | None) -> Any:
    """The run configuration an audit of ``algorithm`` builds: the audit defaults under the
    user's ``options``, the threat model as the run's ``adversary`` where it has one (user-level
    audits; example-level ones build theirs per batch of canaries)."""
    values = audit_values(algorithm, options, threat_model)
    cfg = make_config(values)
    if cfg.task != "least-squares" and cfg.sampling != "full":
        raise ConfigError(
            "user-level audits run the least-squares task's full gradients; for example-level "
            "canaries give dpsgd, decor, ldp, cdp or porter-dp sampling poisson"
        )
    return cfg


def audit_values(
    algorithm: str,
    options: dict[str, Any],
    threat_model: str | None,
    *,
    input_canaries: bool = False,
) -> dict:
    """The audit's run options (module docstring), checked against what it can audit
    (``input_canaries``: PrivSGP(-VR) with a canary example in node 0's data)."""
    if algorithm not in AUDITED:
        raise ConfigError(
            f"privdl audit runs {', '.join(AUDITED)} so far; {algorithm!r} is not audited yet"
        )
    if algorithm in PRIVSGP and input_canaries:
        values = {**PRIVSGP_INPUT_DEFAULTS, **options, "algorithm": algorithm}
        if "task" in options or "batch_size" in options or "ls_dim" in options:
            raise ConfigError(
                "a PrivSGP input-canary audit makes its own data (the canary example at node 0): "
                "give block_size, not task, batch_size or ls_dim"
            )
    elif algorithm in FEDERATED:
        values = {**EXAMPLE_DEFAULTS, "steps": 3, **options, "algorithm": algorithm}
        if "task" in options or "batch_size" in options or "clients" in options:
            raise ConfigError(
                "a client audit makes its own clients and data (canary examples at client 0): "
                "give sampling_rate, not task, clients or batch_size"
            )
    elif example_level(algorithm, options):
        values = {**EXAMPLE_DEFAULTS, **options, "algorithm": algorithm}
        if values.get("sampling") != "poisson" or values.get("clip_mode") != "per_sample":
            raise ConfigError("example-level audits run sampling poisson with clip_mode per_sample")
        if "task" in options or "batch_size" in options:
            raise ConfigError(
                "an example-level audit makes its own data (one canary example per trial): "
                "give sampling_rate, not task or batch_size"
            )
    else:
        # PORTER-DP (Algorithm 1, option I) and PrivSGP(-VR) clip per sample
        own = {"clip_mode": "per_sample"} if algorithm in ("porter-dp", *PRIVSGP) else {}
        values = {**AUDIT_DEFAULTS, **own, **options, "algorithm": algorithm}
    if threat_model is not None:
        if algorithm == "decor":
            values["adversary"] = threat_model
        elif threat_model != AUDITED[algorithm]:
            raise ConfigError(
                f"{algorithm} is accounted against the {AUDITED[algorithm]!r} threat model, not "
                f"{threat_model!r}"
            )
    values["eval_every"] = int(values.get("steps", 10))
    return values


#: Example-level audits (input canaries: canary examples in Poisson-sampled minibatches, through
#: the task's data path): DP-SGD, and the gossip family (the canaries at the threat model's
#: canary node, the adversary's view of the messages or, black box, of the final models).
EXAMPLE_LEVEL = ("dpsgd", "decor", "ldp", "cdp", "porter-dp")


def example_level(algorithm: str, options: dict[str, Any]) -> bool:
    """Whether the options ask for sampled minibatches (canary examples)."""
    return algorithm in EXAMPLE_LEVEL and options.get("sampling", "full") != "full"


def _bounds(
    x: np.ndarray,
    present: np.ndarray,
    rng: np.random.Generator,
    delta: float,
    confidence: float,
    rate: float | None = None,
) -> tuple[str, Any, Any, list[tuple[float, float]]]:
    """Fit the tests on half the trials, keep the one whose bound is larger there, certify it on
    the other half: (test name, Clopper-Pearson bound, GDP bound, observed trade-off). ``rate``:
    a canary's inclusion rate (Poisson sampling), which adds the mixture test."""
    order = rng.permutation(len(present))
    fit, test = order[: len(order) // 2], order[len(order) // 2 :]
    best: tuple[float, str, Any] | None = None
    fitters: list[tuple[str, Any]] = [("fisher", fit_linear_test), ("scan", fit_scan_test)]
    if rate is not None and rate < 1:
        fitters.append(("mixture", lambda v, p: fit_mixture_test(v, p, rate)))
    for name, fitter in fitters:
        scorer = fitter(x[fit], present[fit])
        s = scorer.scores(x[fit])
        a, b = s[~present[fit]], s[present[fit]]
        got = epsilon_lower_bound_heldout(a, b, a, b, delta=delta, confidence=confidence)
        if best is None or got.epsilon_lower > best[0]:
            best = (got.epsilon_lower, name, scorer)
    assert best is not None
    _, name, scorer = best
    s_fit, s_test = scorer.scores(x[fit]), scorer.scores(x[test])
    pieces = (s_fit[~present[fit]], s_fit[present[fit]], s_test[~present[test]],
              s_test[present[test]])  # fmt: skip
    cp = epsilon_lower_bound_heldout(*pieces, delta=delta, confidence=confidence)
    gdp = epsilon_lower_bound_heldout(*pieces, delta=delta, confidence=confidence, method="gdp")
    return name, cp, gdp, empirical_tradeoff(pieces[2], pieces[3])


def audit(
    algorithm: str,
    *,
    trials: int = 20_000,
    threat_model: str | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    batch: int | None = None,
    sampling_rate: float = 0.05,
    one_run: bool = False,
    canaries: int = 1000,
    black_box: bool = False,
    k_plus: int | None = None,
    k_minus: int | None = None,
    known_position: bool = False,
    canary_model: str = "linear",
    input_canaries: bool = False,
    **options: Any,
) -> AuditResult:
    """Audit ``algorithm`` as implemented (module docstring).

    Args:
        algorithm: one of :data:`AUDITED`.
        trials: trials in all (half with each canary world; half fit the test, half certify).
        threat_model: DECOR's adversary (``eavesdropper``, ``curious``, ``collusion:Q``), or the
            baseline's own (``ldp``, ``central``) as a check.
        confidence: probability with which the lower bounds hold.
        seed: seeds the keys of every batch, the canary pattern and the split (reproducible).
        batch: trials per run of the mechanism (memory; default 50 000 for gradient canaries, 20 000
            for PrivSGP, whose run holds one copy of the network per trial,
            4 000 for canary examples, whose dataset grows with the square of it).
        sampling_rate: example level (dpsgd with ``sampling="poisson"``): each canary's rate.
        one_run: audit one run on ``canaries`` canaries (module docstring); ``trials`` and
            ``batch`` are then unused.
        canaries: one-run audits: the canaries in the run (each included with probability 1/2).
        black_box: DP-SGD at example level: the adversary sees the final model only.
        k_plus, k_minus: one-run audits: the guesses (top and bottom scores); default: the
            best of :func:`privdl.audit.one_run.guess_grid`, with a union bound.
        known_position: example level (dpsgd): the canaries sit in the first rows of the data
            (:func:`privdl.audit.examples.build_example_run`), so a sampler that walks the data
            in order shows them at known steps; ``batch`` then defaults to 500.
        canary_model: ``linear`` (one model coordinate per canary) or ``cnn``: mislabelled
            images in a shared bias-free CNN, one run, black box (:mod:`privdl.audit.cnn`;
            needs ``one_run`` and ``black_box``).
        input_canaries: PrivSGP(-VR): a canary example in node 0's data, through the run's
            own sample oracle (:func:`privdl.audit.privsgp.privsgp_input_views`), instead of a
            gradient canary; ``black_box`` implies it. (The others take input canaries with
            ``sampling="poisson"``.)
        **options: the run's options, as ``privdl run`` takes them (``graph``, ``epsilon``,
            ``delta``, ``steps``, ``sigma``, ``sampling``, ...).
    """
    if not isinstance(trials, int) or trials < 16:
        raise ConfigError(f"trials must be an integer >= 16, got {trials!r}")
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must lie in (0, 1), got {confidence}")
    if batch is not None and batch < 2:
        raise ConfigError(f"batch must be >= 2, got {batch}")
    start = time.perf_counter()
    privsgp_input = algorithm in PRIVSGP and (input_canaries or black_box)
    if input_canaries and algorithm not in PRIVSGP:
        raise ConfigError(
            "--input-canaries is for privsgp and privsgp-vr; the others take input canaries "
            f"with --sampling poisson ({', '.join(EXAMPLE_LEVEL)})"
        )
    if black_box and not (example_level(algorithm, options) or privsgp_input):
        raise ConfigError(
            f"black-box audits run input canaries ({', '.join(EXAMPLE_LEVEL)} with --sampling "
            "poisson, privsgp and privsgp-vr)"
        )
    if privsgp_input and (one_run or known_position or canary_model != "linear"):
        raise ConfigError(
            f"{algorithm} input-canary audits run independent trials (no --one-run, "
            "--known-position or --canary-model)"
        )
    gossip_examples = example_level(algorithm, options) and algorithm != "dpsgd"
    if gossip_examples and ((one_run and canary_model != "cnn") or known_position):
        raise ConfigError(
            f"example-level {algorithm} audits run independent trials (no --one-run or "
            "--known-position)"
        )
    if known_position and (one_run or not example_level(algorithm, options)):
        raise ConfigError(
            "known-position canaries are for dpsgd at example level (--sampling poisson), "
            "independent trials"
        )
    if canary_model not in ("linear", "cnn"):
        raise ConfigError(f"canary_model is linear or cnn, got {canary_model!r}")
    if canary_model == "cnn" and not (one_run and black_box):
        raise ConfigError(
            "CNN canaries share one model: they are audited in one run, black box (--one-run "
            "--black-box)"
        )
    if one_run:
        from privdl.audit.one_run_audit import one_run_audit  # it builds an AuditResult

        return one_run_audit(
            algorithm, options, threat_model, confidence=confidence, seed=seed,
            sampling_rate=sampling_rate, canaries=canaries, black_box=black_box, k_plus=k_plus,
            k_minus=k_minus, start=start, canary_model=canary_model,
        )  # fmt: skip
    rng = np.random.default_rng([seed, 0xA0D17])
    if algorithm in FEDERATED:
        run, x, present = _example_trials(
            audit_values(algorithm, options, threat_model), trials=trials, batch=batch or 2000,
            sampling_rate=sampling_rate, seed=seed, rng=rng, federated=True,
        )  # fmt: skip
        canary = {
            "kind": "example at client 0 (white box: its gradient is clipped to exactly C)",
            "size": float(run.cfg.clip),
            "neighbouring": "add_remove: the example is in the client's data or not",
            "sampling_rate": float(run.algorithm.batch_sizes[0] / run.algorithm.num_samples[0]),
        }
        view_text = "every client's update, every round (client 0's, coordinate by coordinate)"
        threat, rate, mixture = "server", None, True
        accounted = client_budget(run)
    elif privsgp_input:
        # a network copy per trial: ChaCha20 streams (same distribution; a run's own wins)
        options = {"noise_backend": "chacha20", **options}
        run, x, present = _privsgp_input_trials(
            audit_values(algorithm, options, threat_model, input_canaries=True), trials=trials,
            batch=batch or 4000, seed=seed, rng=rng, black_box=black_box,
        )  # fmt: skip
        j, b = _entries(run), int(run.cfg.block_size)
        canary = {
            "kind": "example (input canary, black box: the adversary queries the final models)"
            if black_box
            else "example (input canary at node 0: its gradient is clipped to exactly C)",
            "node": 0,
            "size": float(run.cfg.clip),
            "entries": j,
            "block_size": b,
            "neighbouring": "replace_one: the example +Y or -Y (Y = 100 C, label 1) in block 0 "
            f"of node 0's {j} blocks of {b}",
        }
        view_text = (
            f"the final models of nodes {list(range(int(run.comm.n_nodes)))} only (black box): "
            "the task's loss of the canary on them"
            if black_box
            else "node 0's messages (its push-sum half-steps), every step"
        )
        threat, mixture = "ldp", True
        rate = None if black_box or algorithm == "privsgp-vr" else 1.0 / float(j)
    elif algorithm in PRIVSGP:
        vr = algorithm == "privsgp-vr"
        if not vr:  # one network copy per trial: ChaCha20 streams cost a third of the CPU
            # default's per node key (same distribution; a run's own noise_backend wins)
            options = {"noise_backend": "chacha20", **options}
        run, x, present = _privsgp_trials(
            audit_config(algorithm, options, threat_model), trials=trials,
            batch=batch or (50_000 if vr else 20_000), seed=seed, rng=rng, own_draws=not vr,
        )  # fmt: skip
        canary = {
            "kind": "sample (white box: entry 0 of node 0's table)"
            if vr
            else "sample (white box: entry 0 of node 0's data, drawn with probability 1/J)",
            "node": 0,
            "size": float(run.cfg.clip),
            "neighbouring": "replace_one: +-C s_t (public sign pattern, changing over time)",
        }
        view_text = "node 0's messages (its push-sum half-steps), every step"
        threat, mixture = "ldp", True
        # without the table, the canary shows only at the steps that draw it (rate 1/J)
        rate = None if vr else 1.0 / float(_entries(run))
    elif example_level(algorithm, options):
        run, x, present = _example_trials(
            audit_values(algorithm, options, threat_model), trials=trials,
            batch=batch or (500 if known_position else 4000), sampling_rate=sampling_rate,
            seed=seed, rng=rng, black_box=black_box, known_position=known_position,
            fillers=gossip_examples,
        )  # fmt: skip
        canary = example_canary(run, black_box, known_position=known_position)
        if gossip_examples:
            canary["node"] = gossip_view(run).canary
        view_text = (
            gossip_example_view(run, black_box) if gossip_examples
            else BLACK_BOX_VIEW if black_box
            else "the released model after every step (the increments of each trial's weight)"
        )  # fmt: skip
        accounted = dict((run.privacy(run.cfg.steps) if run.privacy is not None else None) or {})
        threat = str(accounted.get("threat_model")) if gossip_examples else "central"
        mixture = True
        rate = None if black_box else float(run.task.sampling_rate)
    else:
        run, x, present, view = _gradient_trials(
            algorithm, options, threat_model, trials=trials, batch=batch or 50_000, seed=seed,
            rng=rng,
        )  # fmt: skip
        canary = {
            "kind": "gradient (white box)",
            "node": view.canary,
            "size": float(run.algorithm.clip.threshold),
            "neighbouring": "replace_one: +-C at every step (public sign pattern)",
        }
        view_text, threat, rate, mixture = view.describe(), view.threat_model, None, False
    cfg = run.cfg
    if algorithm not in FEDERATED and not example_level(algorithm, options):
        accounted = dict((run.privacy(cfg.steps) if run.privacy is not None else None) or {})
    delta = float(accounted.get("delta", cfg.delta or 1e-5))
    test, cp, gdp, tradeoff = _bounds(x, present, rng, delta, confidence, rate)
    return AuditResult(
        algorithm=algorithm,
        threat_model=threat,
        trials=int(len(present)),
        confidence=confidence,
        delta=delta,
        epsilon_lower=float(cp.epsilon_lower),
        epsilon_lower_gdp=math.nan if mixture else float(gdp.epsilon_lower),
        mu_lower=math.nan if mixture else float(gdp.mu_lower or 0.0),
        epsilon_accounted=float(accounted.get("epsilon", math.nan)),
        accounted=accounted,
        canary=canary,
        view=view_text,
        test=test,
        settings={
            "graph": getattr(cfg, "graph", None),
            "steps": cfg.steps,
            "sigma": getattr(cfg, "sigma", None),
            "noise_multiplier": (
                float(run.algorithm.noise_multipliers[0]) if algorithm in FEDERATED else None
            ),
            "sigma_cor": getattr(cfg, "sigma_cor", 0.0),
            "clip": cfg.clip,
            "target_epsilon": cfg.epsilon,
            "seed": seed,
        },
        tradeoff=tradeoff,
        seconds=round(time.perf_counter() - start, 3),
    )


def _gradient_trials(
    algorithm: str,
    options: dict[str, Any],
    threat_model: str | None,
    *,
    trials: int,
    batch: int,
    seed: int,
    rng: np.random.Generator,
) -> tuple[Any, np.ndarray, np.ndarray, Any]:
    """Views of gradient-canary trials (:mod:`privdl.audit.gossip`), batch after batch."""
    from privdl.loop import build_run  # the loop imports the registry, which imports recipes

    run = build_run(audit_config(algorithm, options, threat_model))
    if run.privacy is None:
        raise ConfigError(f"{algorithm} with these options adds no noise: nothing to audit")
    view = gossip_view(run)

    def views_of(world: np.ndarray, signs: np.ndarray, key: int) -> np.ndarray:
        return canary_views(run, view, world=world, signs=signs, seed=key)

    x, present = _signed_trials(run, views_of, trials=trials, batch=batch, seed=seed, rng=rng)
    return run, x, present, view


def _entries(run: Any) -> int:
    """J, the entries of a PrivSGP node (one drawn per step)."""
    from privdl.recipes.privsgp import privsgp_geometry

    return int(privsgp_geometry(run.cfg, run.task)[0])


def _privsgp_trials(
    cfg: Any, *, trials: int, batch: int, seed: int, rng: np.random.Generator, own_draws: bool
) -> tuple[Any, np.ndarray, np.ndarray]:
    """Views of PrivSGP(-VR) canary-sample trials (:mod:`privdl.audit.privsgp`)."""
    from privdl.loop import build_run  # the loop imports the registry, which imports recipes

    run = build_run(cfg)
    if run.privacy is None:
        raise ConfigError(f"{cfg.algorithm} with these options adds no noise: nothing to audit")

    def views_of(world: np.ndarray, signs: np.ndarray, key: int) -> np.ndarray:
        return privsgp_views(run, world=world, signs=signs, seed=key, own_draws=own_draws)

    x, present = _signed_trials(run, views_of, trials=trials, batch=batch, seed=seed, rng=rng)
    return run, x, present


def _privsgp_input_trials(
    values: dict[str, Any],
    *,
    trials: int,
    batch: int,
    seed: int,
    rng: np.random.Generator,
    black_box: bool,
) -> tuple[Any, np.ndarray, np.ndarray]:
    """Views of PrivSGP(-VR) input-canary trials (:func:`privdl.audit.privsgp.
    privsgp_input_views`): one run built, a copy of its network per trial."""
    run = build_privsgp_input_run(values)
    if run.privacy is None:
        raise ConfigError(f"{run.cfg.algorithm} with these options adds no noise: nothing to audit")

    def views_of(world: np.ndarray, signs: np.ndarray, key: int) -> np.ndarray:
        return privsgp_input_views(run, world=world, seed=key, black_box=black_box)

    with one_thread():
        x, present = _signed_trials(run, views_of, trials=trials, batch=batch, seed=seed, rng=rng)
    return run, x, present


def _signed_trials(
    run: Any, views_of: Any, *, trials: int, batch: int, seed: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Batches of +-C canary trials (half of each sign, shuffled) under the public sign pattern:
    ``views_of(world, signs, key)`` gives a batch's views; returns all views and "present".
    An odd batch's extra trial goes to the world with fewer trials so far (-1 on a tie), so the
    two worlds differ by at most one trial in all, whatever the batch sizes (batches of one
    trial included)."""
    signs = public_signs(run.cfg.steps, seed)
    views, worlds = [], []
    lead = 0  # trials in world +1 minus trials in world -1 so far
    for k, size in enumerate(batches(trials, batch)):
        minus = size // 2 + (size % 2 if lead >= 0 else 0)
        lead += size - 2 * minus
        world = rng.permutation(np.where(np.arange(size) < minus, -1.0, 1.0))
        views.append(views_of(world, signs, seed * 7919 + k))
        worlds.append(world)
    return np.concatenate(views), np.concatenate(worlds) > 0


def _example_trials(
    values: dict[str, Any],
    *,
    trials: int,
    batch: int,
    sampling_rate: float,
    seed: int,
    rng: np.random.Generator,
    federated: bool = False,
    black_box: bool = False,
    known_position: bool = False,
    fillers: bool = False,
) -> tuple[Any, np.ndarray, np.ndarray]:
    """Views of canary-example trials (:mod:`privdl.audit.examples`, or at a federated client:
    :mod:`privdl.audit.federated`): equal batches, so every batch's run has the same dataset size
    and the same calibrated noise. ``black_box``: the view is the canary's loss on the final
    model (one feature). ``known_position``: the canaries in the first rows of each batch's data
    (:func:`privdl.audit.examples.build_example_run`)."""
    build, views_of = (
        (build_client_run, client_views) if federated else (build_example_run, example_views)
    )
    if black_box:
        views_of = _gossip_loss_views if fillers else _loss_views
    count = max(1, -(-trials // batch))
    size = 2 * (trials // (2 * count))
    if size < 8:
        raise ConfigError(f"{trials} trials are too few for an example-level audit")
    with one_thread():
        return _example_batches(build, views_of, values, count, size, sampling_rate, seed, rng,
                                known_position, fillers)  # fmt: skip


def _example_batches(
    build: Any,
    views_of: Any,
    values: dict[str, Any],
    count: int,
    size: int,
    sampling_rate: float,
    seed: int,
    rng: np.random.Generator,
    known_position: bool,
    fillers: bool,
) -> tuple[Any, np.ndarray, np.ndarray]:
    """The ``count`` batches of :func:`_example_trials`, ``size`` trials each (``fillers``:
    an all-zero example in every absent slot, as a gossip audit's equal nodes need)."""
    views, flags, run, cfg = [], [], None, None
    for k in range(count):
        present = rng.permutation(np.arange(size) < size // 2)
        extra = {"known_position": True} if known_position else {}
        if fillers:
            extra["fillers"] = True
        run = build(values if cfg is None else cfg.model_dump(), present,
                    sampling_rate=sampling_rate, calibrated=cfg, **extra)  # fmt: skip
        cfg = run.cfg
        views.append(views_of(run, seed=seed * 7919 + k))
        flags.append(present)
    assert run is not None
    return run, np.concatenate(views), np.concatenate(flags)


#: What a black-box adversary sees (example-level DP-SGD).
BLACK_BOX_VIEW = "the final model only (black box): the task's loss of each canary on it"


def _loss_views(run: Any, *, seed: int) -> np.ndarray:
    """``(B, 1)``: each canary's loss on the final model (the black-box view)."""
    return canary_losses(run, seed=seed)[:, None]


def _gossip_loss_views(run: Any, *, seed: int) -> np.ndarray:
    """``(B, nodes)``: each canary's loss on the final models a black-box adversary of a gossip
    run queries (:func:`privdl.audit.examples.gossip_canary_losses`)."""
    return gossip_canary_losses(run, seed=seed)


def gossip_example_view(run: Any, black_box: bool) -> str:
    """What the adversary of an example-level gossip audit sees (input canaries)."""
    from privdl.audit.examples import black_box_nodes

    view = gossip_view(run)
    where = f" (canaries at node {view.canary})"
    if black_box:
        return (
            f"the final models of nodes {list(black_box_nodes(view))} only (black box): the "
            f"task's loss of each canary on them{where}"
        )
    return view.describe() + where


def example_canary(run: Any, black_box: bool, *, known_position: bool = False) -> dict[str, Any]:
    """The canary record of an example-level DP-SGD audit."""
    where = {"position": "the first rows of the data (known order)"} if known_position else {}
    return {
        **where,
        "kind": "example (input canary, black box: the adversary queries the final model)"
        if black_box
        else "example (white box: its gradient is clipped to exactly C)",
        "size": float(run.cfg.clip),
        "neighbouring": "add_remove: the example is in the dataset or not",
        "sampling_rate": float(run.task.sampling_rate),
    }
