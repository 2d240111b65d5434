"""One-run audits of DP-SGD and of a federated client: ``m`` canary examples in *one* run, each
included with probability 1/2, certified by the one-run bound (:mod:`privdl.audit.one_run`;
Steinke, Nasr and Jagielski 2023, Algorithm 1 for the auditor's game).

The run is the example-level one (:mod:`privdl.audit.examples`, :mod:`privdl.audit.federated`):
canary ``k`` is the example ``100 C e_k`` (label 1) on its own coordinate of a bias-free linear
model, so its gradient is clipped to exactly ``C``. An excluded canary's slot holds an all-zero
example instead (zero gradient), so the dataset size, the Poisson rate ``q = b / m`` and the
denominator ``b`` are the same whichever canaries are in: the run is one fixed mechanism applied
to neighbouring datasets (add/remove of each canary).

The scores are fixed before the run and never read the inclusions:

* white box, DP-SGD (the released model after every step): the log-likelihood ratio of a
  canary that joins each step with probability ``q`` and then moves its coordinate by
  ``eta C / b`` under noise of std ``eta sigma`` (the run's public parameters):
  ``sum_t log(1 - q + q exp(a z_t - a^2 / 2))``, ``z_t`` the step's increment in noise units,
  ``a = C / (b sigma)``; the sum of the increments when ``q = 1``;
* white box, federated client (client 0's update every round, seen by the server): the sum of
  the canary's coordinate of the updates;
* black box (DP-SGD, the final model only): minus the task's loss of the canary on the final
  model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from privdl.audit.api import (
    BLACK_BOX_VIEW,
    FEDERATED,
    AuditResult,
    audit_values,
    example_canary,
    example_level,
)
from privdl.audit.estimators import empirical_tradeoff
from privdl.audit.examples import build_example_run, canary_losses, example_views
from privdl.audit.federated import build_client_run, client_budget, client_views
from privdl.audit.gossip import MAX_CELLS
from privdl.audit.one_run import one_run_bound_from_scores
from privdl.audit.scores import MixtureTest
from privdl.errors import ConfigError

__all__ = ["OneRunTrial", "one_run_audit", "one_run_trial"]


@dataclass(frozen=True)
class OneRunTrial:
    """One run on ``m`` canaries: the run, every canary's score, which were included."""

    run: Any
    scores: np.ndarray
    included: np.ndarray
    #: what the score is (for the report)
    score: str


def one_run_trial(
    values: dict[str, Any],
    *,
    canaries: int,
    sampling_rate: float,
    seed: int,
    federated: bool = False,
    black_box: bool = False,
) -> OneRunTrial:
    """Draw the inclusions (probability 1/2 each, seeded), build the run as a run would be built
    (noise calibrated to ``values``' epsilon), run it once, and score every canary (module
    docstring)."""
    if not isinstance(canaries, int) or canaries < 10:
        raise ConfigError(
            f"a one-run audit needs an integer of at least 10 canaries, got {canaries!r}"
        )
    if canaries * canaries > MAX_CELLS:
        raise ConfigError(
            f"{canaries} canaries make a {canaries} x {canaries} dataset: too large for one "
            "audit (at most 7000)"
        )
    if federated and black_box:
        raise ConfigError("black-box audits run DP-SGD (the final model); a client's is white box")
    included = np.random.default_rng([seed, 0x0E1]).random(canaries) < 0.5
    build = build_client_run if federated else build_example_run
    run = build(values, included, sampling_rate=sampling_rate, fillers=True)
    key = seed * 7919
    if black_box:
        return OneRunTrial(run, -canary_losses(run, seed=key), included,
                           "minus the canary's loss on the final model")  # fmt: skip
    if federated:
        views = client_views(run, seed=key)
        return OneRunTrial(run, views.sum(axis=1), included,
                           "the sum of the canary's coordinate of client 0's updates")  # fmt: skip
    views = example_views(run, seed=key)
    return OneRunTrial(run, _mixture_scores(run, views), included,
                       "the likelihood ratio of a canary included at rate q (run's sigma, C, b)")  # fmt: skip


def _mixture_scores(run: Any, views: np.ndarray) -> np.ndarray:
    """The likelihood-ratio score of each canary's increments (module docstring), from the run's
    public parameters only."""
    cfg = run.cfg
    rate, lr, sigma = float(run.task.sampling_rate), float(cfg.lr), float(cfg.sigma or 0.0)
    if sigma <= 0:
        raise ConfigError("the run adds no noise: nothing to audit")
    if rate >= 1:
        return views.sum(axis=1)
    shift = float(cfg.clip) / (float(cfg.batch_size) * sigma)
    steps = views.shape[1]
    test = MixtureTest(rate, np.full(steps, shift), np.zeros(steps), np.full(steps, lr * sigma))
    return test.scores(views)


def one_run_audit(
    algorithm: str,
    options: dict[str, Any],
    threat_model: str | None,
    *,
    confidence: float,
    seed: int,
    sampling_rate: float,
    canaries: int,
    black_box: bool,
    k_plus: int | None,
    k_minus: int | None,
    start: float,
) -> AuditResult:
    """``privdl.audit.audit(..., one_run=True)``: one run on ``canaries`` canary examples,
    certified by the one-run bound (module docstring), as an :class:`AuditResult`."""
    federated = algorithm in FEDERATED
    if not (federated or example_level(algorithm, options)):
        raise ConfigError(
            "one-run audits run dpsgd at example level (--sampling poisson) or a federated "
            f"client ({', '.join(FEDERATED)}), not {algorithm}"
        )
    values = audit_values(algorithm, options, threat_model)
    got = one_run_trial(values, canaries=canaries, sampling_rate=sampling_rate, seed=seed,
                        federated=federated, black_box=black_box)  # fmt: skip
    run, cfg = got.run, got.run.cfg
    if federated:
        accounted = client_budget(run)
        canary = {
            "kind": "example at client 0 (white box: its gradient is clipped to exactly C)",
            "size": float(cfg.clip),
            "neighbouring": "add_remove: the example is in the client's data or not",
            "sampling_rate": float(run.algorithm.batch_sizes[0] / run.algorithm.num_samples[0]),
        }
        view_text = "every client's update, every round (client 0's, coordinate by coordinate)"
        threat = "server"
    else:
        accounted = dict((run.privacy(cfg.steps) if run.privacy is not None else None) or {})
        if not accounted:
            raise ConfigError(f"{algorithm} with these options adds no noise: nothing to audit")
        canary = example_canary(run, black_box)
        view_text = BLACK_BOX_VIEW if black_box else "the released model after every step"
        threat = "central"
    delta = float(accounted.get("delta", cfg.delta or 1e-5))
    bound = one_run_bound_from_scores(got.scores, got.included, delta=delta,
                                      confidence=confidence, k_plus=k_plus, k_minus=k_minus)  # fmt: skip
    return AuditResult(
        algorithm=algorithm,
        threat_model=threat,
        trials=canaries,
        confidence=confidence,
        delta=delta,
        epsilon_lower=float(bound.epsilon_lower),
        epsilon_lower_gdp=math.nan,
        mu_lower=math.nan,
        epsilon_accounted=float(accounted.get("epsilon", math.nan)),
        accounted=accounted,
        canary=canary,
        view=view_text,
        test=f"one-run (top {bound.k_plus} in, bottom {bound.k_minus} out)",
        settings={
            "steps": cfg.steps,
            "sigma": getattr(cfg, "sigma", None),
            "noise_multiplier": (float(run.algorithm.noise_multipliers[0]) if federated else None),
            "clip": cfg.clip,
            "target_epsilon": cfg.epsilon,
            "seed": seed,
        },
        tradeoff=empirical_tradeoff(got.scores[~got.included], got.scores[got.included]),
        seconds=round(time.perf_counter() - start, 3),
        one_run={
            "canaries": bound.canaries,
            "included": int(np.sum(got.included)),
            "guesses": bound.guesses,
            "correct": bound.correct,
            "k_plus": bound.k_plus,
            "k_minus": bound.k_minus,
            "candidates": bound.candidates,
            "score": got.score,
            "bound": "Steinke, Nasr and Jagielski 2023 (one run; union bound over candidates)",
        },
    )
