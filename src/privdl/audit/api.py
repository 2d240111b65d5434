"""``privdl.audit.audit``: an empirical lower bound on epsilon beside the accountant's upper bound.

One call builds the run exactly as ``privdl run`` would from the same options (the noise
calibrated to ``epsilon`` by the run's accountant), runs its mechanism on neighbouring inputs in
``trials`` seeded trials (:mod:`privdl.audit.gossip`), fits the adversary's test on half of them
and certifies on the other half, with Clopper-Pearson confidence limits (assumption-free) and,
beside it, the bound that assumes the mechanism is mu-GDP (Nasr et al. 2023; every Gaussian
mechanism and composition is). A correct implementation gives ``epsilon_lower <=
epsilon_accounted`` with probability at least ``confidence``; a lower bound above the accounted
epsilon shows that the code does not deliver what its accountant certifies.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from privdl.audit.estimators import empirical_tradeoff, epsilon_lower_bound_heldout
from privdl.audit.gossip import batches, canary_views, gossip_view, public_signs
from privdl.audit.scores import fit_linear_test
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
}

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
    #: the bound assuming the mechanism is mu-GDP, and its mu
    epsilon_lower_gdp: float
    mu_lower: float
    epsilon_accounted: float
    #: the accountant's labelled budget (accountant, neighbouring, unit, threat model, mu)
    accounted: dict[str, Any]
    canary: dict[str, Any]
    view: str
    settings: dict[str, Any]
    #: observed (FPR, FNR) of the fitted test on the certifying trials
    tradeoff: list[tuple[float, float]] = field(repr=False)
    seconds: float = 0.0

    @property
    def within_accounted(self) -> bool:
        """Whether both lower bounds are at most the accounted epsilon (what a correct
        implementation shows with probability >= ``confidence``)."""
        return max(self.epsilon_lower, self.epsilon_lower_gdp) <= self.epsilon_accounted

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tradeoff"] = [list(p) for p in self.tradeoff]
        out["within_accounted"] = self.within_accounted
        return out


def audit_config(algorithm: str, options: dict[str, Any], threat_model: str | None) -> Any:
    """The run configuration an audit of ``algorithm`` builds: the audit defaults under the
    user's ``options``, the threat model as the run's ``adversary`` where it has one."""
    if algorithm not in AUDITED:
        raise ConfigError(
            f"privdl audit runs {', '.join(AUDITED)} so far; {algorithm!r} is not audited yet"
        )
    own = {"clip_mode": "per_sample"} if algorithm == "porter-dp" else {}  # its Algorithm 1, I
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
    cfg = make_config(values)
    if cfg.task != "least-squares" and cfg.sampling != "full":
        raise ConfigError(
            "privdl audit runs user-level canaries (sampling full) so far; example-level "
            "audits with sampled canaries are not built yet"
        )
    return cfg


def audit(
    algorithm: str,
    *,
    trials: int = 2000,
    threat_model: str | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    batch: int = 50_000,
    **options: Any,
) -> AuditResult:
    """Audit ``algorithm`` as implemented (module docstring).

    Args:
        algorithm: one of :data:`AUDITED`.
        trials: trials in all (half with each canary sign; half fit the test, half certify).
        threat_model: DECOR's adversary (``eavesdropper``, ``curious``, ``collusion:Q``), or the
            baseline's own (``ldp``, ``central``) as a check.
        confidence: probability with which the lower bounds hold.
        seed: seeds the keys of every batch, the canary pattern and the split (reproducible).
        batch: trials per run of the mechanism (memory).
        **options: the run's options, as ``privdl run`` takes them (``graph``, ``epsilon``,
            ``delta``, ``steps``, ``sigma``, ...).
    """
    from privdl.loop import build_run  # the loop imports the registry, which imports recipes

    if not isinstance(trials, int) or trials < 16:
        raise ConfigError(f"trials must be an integer >= 16, got {trials!r}")
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must lie in (0, 1), got {confidence}")
    if batch < 2:
        raise ConfigError(f"batch must be >= 2, got {batch}")
    start = time.perf_counter()
    cfg = audit_config(algorithm, options, threat_model)
    run = build_run(cfg)
    cfg = run.cfg
    if run.privacy is None:
        raise ConfigError(f"{algorithm} with these options adds no noise: nothing to audit")
    accounted = run.privacy(cfg.steps) or {}
    view = gossip_view(run)
    signs = public_signs(cfg.steps, seed)
    rng = np.random.default_rng([seed, 0xA0D17])
    views, worlds = [], []
    for k, size in enumerate(batches(trials, batch)):
        world = rng.permutation(np.where(np.arange(size) < size // 2, -1.0, 1.0))
        views.append(canary_views(run, view, world=world, signs=signs, seed=seed * 7919 + k))
        worlds.append(world)
    x, present = np.concatenate(views), np.concatenate(worlds) > 0
    order = rng.permutation(len(present))
    fit, test = order[: len(order) // 2], order[len(order) // 2 :]
    scorer = fit_linear_test(x[fit], present[fit])
    s_fit, s_test = scorer.scores(x[fit]), scorer.scores(x[test])
    delta = float(accounted.get("delta", cfg.delta or 1e-5))
    pieces = (s_fit[~present[fit]], s_fit[present[fit]], s_test[~present[test]],
              s_test[present[test]])  # fmt: skip
    cp = epsilon_lower_bound_heldout(*pieces, delta=delta, confidence=confidence)
    gdp = epsilon_lower_bound_heldout(*pieces, delta=delta, confidence=confidence, method="gdp")
    return AuditResult(
        algorithm=algorithm,
        threat_model=view.threat_model,
        trials=int(len(present)),
        confidence=confidence,
        delta=delta,
        epsilon_lower=float(cp.epsilon_lower),
        epsilon_lower_gdp=float(gdp.epsilon_lower),
        mu_lower=float(gdp.mu_lower or 0.0),
        epsilon_accounted=float(accounted.get("epsilon", math.nan)),
        accounted=dict(accounted),
        canary={
            "kind": "gradient (white box)",
            "node": view.canary,
            "size": float(run.algorithm.clip.threshold),
            "neighbouring": "replace_one: +-C at every step (public sign pattern)",
        },
        view=view.describe(),
        settings={
            "graph": getattr(cfg, "graph", None),
            "steps": cfg.steps,
            "sigma": cfg.sigma,
            "sigma_cor": getattr(cfg, "sigma_cor", 0.0),
            "clip": cfg.clip,
            "target_epsilon": cfg.epsilon,
            "seed": seed,
        },
        tradeoff=empirical_tradeoff(s_test[~present[test]], s_test[present[test]]),
        seconds=round(time.perf_counter() - start, 3),
    )
