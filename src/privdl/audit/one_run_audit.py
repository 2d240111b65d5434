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

The gossip family (DECOR per threat model, LDP, CDP, unsampled DP-SGD, PORTER-DP: user level,
white-box gradient canaries, :mod:`privdl.audit.gossip`) is audited in one run as well: every
coordinate of the models is a canary, ``m`` of them in one run of the algorithm's own steps (one
set of keys), canary ``k``'s gradient ``S_k s_t C`` with ``S_k = +-1`` drawn with probability 1/2
(replace-one: flipping ``S_k`` is one neighbouring pair, the relation the accountant bounds). The
first half of the canaries are *reference* canaries: their ``S`` is handed to the auditor, who fits
Fisher's discriminant on their views (:func:`privdl.audit.scores.fit_linear_test`); it scores
and guesses the other half, which alone enter the bound (``m / 2`` canaries). Conditioned on the
reference canaries' ``S`` (then fixed data, like any other example), the mechanism is still
(epsilon, delta)-DP in each guessed ``S_k`` and the guesser is a fixed function of the output, so
the theorem applies as it stands.
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
from privdl.audit.gossip import MAX_CELLS, canary_views, gossip_view, public_signs
from privdl.audit.one_run import one_run_bound_from_scores
from privdl.audit.scores import MixtureTest, fit_linear_test
from privdl.engine.threads import one_thread
from privdl.errors import ConfigError

__all__ = [
    "GOSSIP",
    "OneRunTrial",
    "cnn_one_run_audit",
    "gossip_one_run_audit",
    "one_run_audit",
    "one_run_trial",
]

#: The algorithms audited in one run with white-box gradient canaries (user level).
GOSSIP = ("decor", "ldp", "cdp", "dpsgd", "porter-dp")


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
    canary_model: str = "linear",
) -> AuditResult:
    """``privdl.audit.audit(..., one_run=True)``: one run on ``canaries`` canary examples,
    certified by the one-run bound (module docstring), as an :class:`AuditResult`."""
    federated = algorithm in FEDERATED
    if canary_model == "cnn":
        return cnn_one_run_audit(
            algorithm, options, threat_model, confidence=confidence, seed=seed,
            sampling_rate=sampling_rate, canaries=canaries, k_plus=k_plus, k_minus=k_minus,
            start=start,
        )  # fmt: skip
    if algorithm in GOSSIP and not example_level(algorithm, options):
        if black_box:
            raise ConfigError("black-box audits run dpsgd at example level (--sampling poisson)")
        return gossip_one_run_audit(
            algorithm, options, threat_model, confidence=confidence, seed=seed,
            canaries=canaries, k_plus=k_plus, k_minus=k_minus, start=start,
        )  # fmt: skip
    if not (federated or example_level(algorithm, options)):
        raise ConfigError(
            "one-run audits run the gossip family (decor, ldp, cdp, dpsgd, porter-dp: gradient "
            "canaries), dpsgd at example level (--sampling poisson) or a federated client "
            f"({', '.join(FEDERATED)}), not {algorithm}"
        )
    values = audit_values(algorithm, options, threat_model)
    with one_thread():
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
    return _one_run_result(
        algorithm,
        threat,
        got.scores,
        got.included,
        trials=canaries,
        accounted=accounted,
        cfg=cfg,
        confidence=confidence,
        k_plus=k_plus,
        k_minus=k_minus,
        canary=canary,
        view=view_text,
        settings={
            "steps": cfg.steps,
            "sigma": getattr(cfg, "sigma", None),
            "noise_multiplier": (float(run.algorithm.noise_multipliers[0]) if federated else None),
            "clip": cfg.clip,
            "target_epsilon": cfg.epsilon,
            "seed": seed,
        },
        start=start,
        score=got.score,
    )


def gossip_one_run_audit(
    algorithm: str,
    options: dict[str, Any],
    threat_model: str | None,
    *,
    confidence: float,
    seed: int,
    canaries: int,
    k_plus: int | None,
    k_minus: int | None,
    start: float,
) -> AuditResult:
    """One run of a gossip-family algorithm on ``canaries`` gradient canaries (module
    docstring): half reference canaries that fit the test, half guessed and certified by the
    one-run bound."""
    from privdl.audit.api import audit_config
    from privdl.loop import build_run  # the loop imports the registry, which imports recipes

    if not isinstance(canaries, int) or canaries < 20:
        raise ConfigError(
            f"a one-run gossip audit needs an integer of at least 20 canaries, got {canaries!r}"
        )
    run = build_run(audit_config(algorithm, options, threat_model))
    if run.privacy is None:
        raise ConfigError(f"{algorithm} with these options adds no noise: nothing to audit")
    cfg = run.cfg
    view = gossip_view(run)
    world = np.where(np.random.default_rng([seed, 0x0E1]).random(canaries) < 0.5, 1.0, -1.0)
    views = canary_views(run, view, world=world, signs=public_signs(cfg.steps, seed),
                         seed=seed * 7919)  # fmt: skip
    plus = world > 0
    half = canaries // 2  # canaries 0 .. half-1: reference (their S known), the rest guessed
    test = fit_linear_test(views[:half], plus[:half])
    scores, included = test.scores(views[half:]), plus[half:]
    accounted = dict(run.privacy(cfg.steps) or {})
    return _one_run_result(
        algorithm,
        view.threat_model,
        scores,
        included,
        trials=canaries,
        accounted=accounted,
        cfg=cfg,
        confidence=confidence,
        k_plus=k_plus,
        k_minus=k_minus,
        canary={
            "kind": "gradient (white box), one per coordinate, all in one run",
            "node": view.canary,
            "size": float(run.algorithm.clip.threshold),
            "neighbouring": "replace_one: +-C s_t (public sign pattern), the sign S_k drawn "
            "with probability 1/2",
        },
        view=view.describe(),
        settings={
            "graph": getattr(cfg, "graph", None),
            "steps": cfg.steps,
            "sigma": getattr(cfg, "sigma", None),
            "sigma_cor": getattr(cfg, "sigma_cor", 0.0),
            "clip": cfg.clip,
            "target_epsilon": cfg.epsilon,
            "seed": seed,
        },
        start=start,
        score="Fisher's discriminant of the view, fitted on the reference canaries",
        reference=half,
    )


def cnn_one_run_audit(
    algorithm: str,
    options: dict[str, Any],
    threat_model: str | None,
    *,
    confidence: float,
    seed: int,
    sampling_rate: float,
    canaries: int,
    k_plus: int | None,
    k_minus: int | None,
    start: float,
) -> AuditResult:
    """One run of ``algorithm`` (DP-SGD or the gossip family, Poisson minibatches) training the
    shared bias-free CNN of :mod:`privdl.audit.cnn` on ``canaries`` mislabelled canary images
    (each included with probability 1/2) beside ``canaries // 5`` base images per node; the
    black-box score is minus each canary's loss on the final model(s) the threat model's
    adversary queries, certified by the one-run bound."""
    from privdl.audit.cnn import build_cnn_run, cnn_canary_losses

    if not example_level(algorithm, options):
        raise ConfigError(
            "CNN canaries are mislabelled images in Poisson minibatches: give dpsgd, decor, ldp, "
            "cdp or porter-dp with --sampling poisson"
        )
    if not isinstance(canaries, int) or not 10 <= canaries <= 20_000:
        raise ConfigError(f"a CNN audit takes 10 to 20000 canaries, got {canaries!r}")
    values = audit_values(algorithm, options, threat_model)
    included = np.random.default_rng([seed, 0x0E1]).random(canaries) < 0.5
    base = canaries // 5
    with one_thread():
        run = build_cnn_run(values, included, sampling_rate=sampling_rate, base=base, seed=seed)
        scores = -cnn_canary_losses(run, canaries=canaries, seed=seed, key=seed * 7919)
    cfg = run.cfg
    accounted = dict((run.privacy(cfg.steps) if run.privacy is not None else None) or {})
    if not accounted:
        raise ConfigError(f"{algorithm} with these options adds no noise: nothing to audit")
    gossip = int(run.topology.n) > 1
    if gossip:
        from privdl.audit.api import gossip_example_view
        from privdl.audit.gossip import gossip_view

        view, node = gossip_example_view(run, True), gossip_view(run).canary
    else:
        view, node = BLACK_BOX_VIEW, 0
    return _one_run_result(
        algorithm,
        str(accounted.get("threat_model", "central")),
        scores,
        included,
        trials=canaries,
        accounted=accounted,
        cfg=cfg,
        confidence=confidence,
        k_plus=k_plus,
        k_minus=k_minus,
        canary={
            "kind": "mislabelled image in a shared CNN (input canary, black box: the adversary "
            "queries the final model)",
            "model": "cnn (bias-free: conv 3x3, ReLU, conv 3x3 stride 2, ReLU, linear)",
            "node": node,
            "base_images": base,
            "size": float(cfg.clip),
            "neighbouring": "add_remove: the image is in the node's data or not",
            "sampling_rate": float(cfg.batch_size) / float(canaries + base),
        },
        view=view,
        settings={
            "graph": getattr(cfg, "graph", None),
            "steps": cfg.steps,
            "sigma": getattr(cfg, "sigma", None),
            "lr": cfg.lr,
            "clip": cfg.clip,
            "target_epsilon": cfg.epsilon,
            "seed": seed,
        },
        start=start,
        score="minus the canary's loss on the final model(s)",
    )


def _one_run_result(
    algorithm: str,
    threat_model: str,
    scores: np.ndarray,
    included: np.ndarray,
    *,
    trials: int,
    accounted: dict[str, Any],
    cfg: Any,
    confidence: float,
    k_plus: int | None,
    k_minus: int | None,
    canary: dict[str, Any],
    view: str,
    settings: dict[str, Any],
    start: float,
    score: str,
    reference: int | None = None,
) -> AuditResult:
    """The Steinke-Nasr-Jagielski bound of one run's canary ``scores`` (``included``: which
    canaries were in), labelled beside the accounted epsilon; ``reference``: how many canaries
    fitted the test (gossip audits), shown in its name and kept out of the guesses."""
    delta = float(accounted.get("delta", cfg.delta or 1e-5))
    bound = one_run_bound_from_scores(scores, included, delta=delta, confidence=confidence,
                                      k_plus=k_plus, k_minus=k_minus)  # fmt: skip
    fitted = "" if reference is None else f"fisher fitted on {reference} reference canaries; "
    one_run: dict[str, Any] = {"canaries": bound.canaries}
    if reference is not None:
        one_run["reference"] = reference
    one_run |= {
        "included": int(np.sum(included)),
        "guesses": bound.guesses,
        "correct": bound.correct,
        "k_plus": bound.k_plus,
        "k_minus": bound.k_minus,
        "candidates": bound.candidates,
        "score": score,
        "bound": "Steinke, Nasr and Jagielski 2023 (one run; union bound over candidates)",
    }
    return AuditResult(
        algorithm=algorithm,
        threat_model=threat_model,
        trials=trials,
        confidence=confidence,
        delta=delta,
        epsilon_lower=float(bound.epsilon_lower),
        epsilon_lower_gdp=math.nan,
        mu_lower=math.nan,
        epsilon_accounted=float(accounted.get("epsilon", math.nan)),
        accounted=accounted,
        canary=canary,
        view=view,
        test=f"one-run ({fitted}top {bound.k_plus} in, bottom {bound.k_minus} out)",
        settings=settings,
        tradeoff=empirical_tradeoff(scores[~included], scores[included]),
        seconds=round(time.perf_counter() - start, 3),
        one_run=one_run,
    )
