"""Privacy of a configured run: noise calibration before training, epsilon spent during it.

The unit follows the clipping: ``batch_mean`` clipping of a node's gradient (and the full-gradient
least-squares task) is user-level, ``per_sample`` clipping with a batch mean over ``b`` examples is
example-level with sensitivity ``2C/b`` (replace-one) and amplification by the sampling scheme
(fixed-size without replacement, or Poisson under add/remove) through dp-accounting's RDP
accountant. Each DECOR/LDP step reduces to its equivalent Gaussian mechanism by the SecRDP
accountant (Algorithms 2/3); user-level totals use the paper's classic RDP->DP conversion.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from privdl.errors import ConfigError

DEFAULT_DELTA = 1e-5


def _unit(cfg, task) -> str:
    if (
        cfg.clip_mode == "per_sample"
        and getattr(task, "kind", "") == "supervised"
        and cfg.sampling != "full"
    ):
        return "example"
    return "user"


def _threat(cfg) -> str:
    if cfg.algorithm == "cdp":
        return "central"
    if cfg.algorithm == "ldp":
        return "ldp"
    return cfg.adversary


def _sampling(cfg, task) -> tuple[str, str, float, int]:
    """(dp-accounting sampling, neighbouring, rate, records per node) of example-level runs."""
    m = int(task.data.counts.min())
    rate = min(1.0, cfg.batch_size / m)
    if cfg.sampling == "poisson":
        return "poisson", "add_remove", rate, m
    return "fixed_size", "replace_one", rate, m


def step_rdp(cfg, topo, task, *, sigma: float, sigma_cor: float) -> float:
    """Per-step RDP slope at the replace-one sensitivity of the run's privacy unit."""
    from privdl.accounting.secrdp import decor_step_rdp

    c = float(cfg.clip)
    if _unit(cfg, task) == "example":
        c = c / cfg.batch_size
    if cfg.algorithm == "cdp":
        return 2.0 * c * c / (topo.n * sigma * sigma)
    adversary = "ldp" if cfg.algorithm == "ldp" else cfg.adversary
    return float(
        decor_step_rdp(
            topo.graph, sigma_cdp=sigma, sigma_cor=sigma_cor, clip=c, adversary=adversary
        ).step_rdp
    )


def spent(
    cfg, topo, task, *, sigma: float, sigma_cor: float
) -> Callable[[int], dict[str, Any] | None]:
    """``t -> labelled (epsilon, delta)`` after ``t`` steps (``None`` for a non-private run)."""
    from privdl.accounting.budget import PrivacyBudget
    from privdl.accounting.conversion import compose_convert
    from privdl.accounting.dpsgd import event_epsilon
    from privdl.accounting.events import DecorStepEvent

    if cfg.algorithm == "dsgd":
        return lambda t: None
    delta = cfg.delta if cfg.delta is not None else DEFAULT_DELTA
    unit = _unit(cfg, task)
    threat = _threat(cfg)
    rho = step_rdp(cfg, topo, task, sigma=sigma, sigma_cor=sigma_cor)

    if unit == "user":

        def at(t: int) -> dict[str, Any]:
            eps = (
                0.0 if t == 0 else compose_convert(rho, steps=t, delta=delta, conversion="classic")
            )
            return PrivacyBudget(
                epsilon=eps,
                delta=delta,
                accountant="secrdp+classic",
                neighbouring="replace_one",
                unit="user",
                threat_model=threat,
                notes=f"step_rdp={rho:.6g}",
            ).to_dict()

        return at

    sampling, neighbouring, rate, m = _sampling(cfg, task)

    def at_example(t: int) -> dict[str, Any]:
        if t == 0:
            eps = 0.0
        else:
            ev = DecorStepEvent(
                step_rdp=rho,
                steps=t,
                threat_model=threat,
                sampling_rate=rate,
                sampling=sampling,
                dataset_size=m,
            )
            eps = event_epsilon(ev.as_gaussian(neighbouring), delta=delta, accountant="rdp")
        return PrivacyBudget(
            epsilon=eps,
            delta=delta,
            accountant="secrdp+rdp-subsampled",
            neighbouring=neighbouring,
            unit="example",
            threat_model=threat,
            notes=f"{sampling} sampling q={rate:.4g}, step_rdp={rho:.6g}",
        ).to_dict()

    return at_example


def calibrate(cfg, topo, task):
    """Return ``cfg`` with ``sigma`` (and for DECOR ``sigma_cor``) set for its target epsilon.

    Without a target (``epsilon`` unset) the config is returned unchanged. The calibration is
    conservative: the accounted epsilon after ``steps`` is at most the target.
    """
    if cfg.epsilon is None or cfg.algorithm == "dsgd":
        return cfg
    if cfg.clip is None:
        raise ConfigError("a target epsilon needs a clipping threshold (clip)")
    delta = cfg.delta if cfg.delta is not None else DEFAULT_DELTA
    from privdl.accounting.conversion import step_rdp_for_epsilon

    unit = _unit(cfg, task)
    c = float(cfg.clip) / (cfg.batch_size if unit == "example" else 1)
    n = topo.n
    if unit == "user":
        rho = step_rdp_for_epsilon(cfg.epsilon, steps=cfg.steps, delta=delta)
    else:
        from privdl.accounting.dpsgd import calibrate_noise_multiplier

        sampling, neighbouring, rate, m = _sampling(cfg, task)
        z = calibrate_noise_multiplier(
            target_epsilon=cfg.epsilon,
            sampling_rate=rate,
            steps=cfg.steps,
            delta=delta,
            accountant="rdp",
            sampling=sampling,
            neighbouring=neighbouring,
            dataset_size=m,
        )
        # the equivalent replace-one slope 1/(2 z_r^2); z_r = z (replace) or z/2 (add/remove)
        z_r = z if neighbouring == "replace_one" else z / 2.0
        rho = 1.0 / (2.0 * z_r * z_r)
    sigma_ldp = c * math.sqrt(2.0 / rho)
    if cfg.algorithm == "ldp":
        return cfg.with_updates(sigma=sigma_ldp * (1 + 1e-9), delta=delta)
    if cfg.algorithm == "cdp":
        return cfg.with_updates(sigma=sigma_ldp / math.sqrt(n) * (1 + 1e-9), delta=delta)
    # DECOR: sigma_cdp fixed (given, or a default point of its admissible range), sigma_cor
    # calibrated by bisection so that the SecRDP step slope is at most rho (Alg 2/3).
    from privdl.accounting.calibration import calibrate_sigma_cor
    from privdl.accounting.conversion import compose_convert

    sigma_cdp = cfg.sigma if cfg.sigma > 0 else _default_sigma_cdp(sigma_ldp, n)
    eps_one_step = compose_convert(rho * (1 - 1e-9), steps=1, delta=delta, conversion="classic")
    cal = calibrate_sigma_cor(
        topo.graph,
        epsilon=eps_one_step,
        delta=delta,
        steps=1,
        sigma_cdp=sigma_cdp,
        clip=c,
        adversary=cfg.adversary,
    )
    return cfg.with_updates(sigma=sigma_cdp, sigma_cor=cal.sigma_cor, delta=delta)


def _default_sigma_cdp(sigma_ldp: float, n: int) -> float:
    """A default point inside (sigma_ldp/sqrt(n), sigma_ldp]: twice the CDP std (capped)."""
    return min(sigma_ldp, 2.0 * sigma_ldp / math.sqrt(n))


def run_accountant(cfg, topo, task) -> Callable[[int], dict[str, Any] | None]:
    """The privacy-spent function of a built run (noise already calibrated)."""
    if cfg.algorithm == "dsgd":
        return lambda t: None
    return spent(cfg, topo, task, sigma=cfg.sigma, sigma_cor=cfg.sigma_cor)


# --- reproduction helpers (DECOR spec s.4.5, s.4.7) ---------------------------------------------

LEGACY_LABEL = "legacy, not a valid (eps, delta) guarantee"


def legacy_example_epsilon(step_rdp: float, *, sampling_rate: float) -> float:
    """The DECOR reference code's example-level "epsilon" (spec s.4.7, LEGACY).

    min over integer alpha in [2, 256] of the Wang et al. (2019) subsampled RDP bound of ONE step:
    T and delta are ignored, so this is NOT a differential-privacy guarantee. It is what the
    paper's MNIST budgets {1e-3, 1e-2, 0.1, 1} (Fig 1c, Fig 3) measure.
    """
    import numpy as np

    from privdl.accounting.dpsgd import wang_fixed_size_rdp

    orders = np.arange(2, 257)
    return float(np.min(wang_fixed_size_rdp(float(step_rdp), float(sampling_rate), orders)))


def legacy_step_rdp_for_epsilon(epsilon: float, *, sampling_rate: float) -> float:
    """Largest per-step slope whose legacy (uncomposed) example-level value is <= ``epsilon``.

    Bisection on log(step_rdp); the legacy value is non-decreasing in the slope.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"epsilon must be positive, got {epsilon}")
    lo, hi = 1e-12, 1.0
    while legacy_example_epsilon(hi, sampling_rate=sampling_rate) <= epsilon:
        lo, hi = hi, hi * 4.0
        if hi > 1e6:
            return hi
    while legacy_example_epsilon(lo, sampling_rate=sampling_rate) > epsilon:
        lo /= 4.0
        if lo < 1e-30:
            raise ConfigError(f"legacy epsilon {epsilon} is unreachable")
    while hi / lo - 1.0 > 1e-9:
        mid = math.sqrt(lo * hi)
        if legacy_example_epsilon(mid, sampling_rate=sampling_rate) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def decor_pair_for_step_rdp(
    graph,
    *,
    step_rdp: float,
    clip: float,
    sigma_cdp_grid,
    sigma_cor_max: float | None = None,
    adversary: str = "eavesdropper",
) -> tuple[float, float]:
    """(sigma_cdp, sigma_cor): the first ``sigma_cdp`` of the grid with a feasible ``sigma_cor``.

    For each candidate sigma_cdp the smallest sigma_cor with SecRDP slope (Alg 2/3) <= ``step_rdp``
    is found by conservative bisection; the pair is accepted if ``sigma_cor <= sigma_cor_max``.
    This is the reference code's rule "smallest sigma_cdp on the grid for which the sigma_cor
    search succeeds" (spec s.6.3, s.6.4), made conservative.
    """
    from privdl.accounting.calibration import calibrate_sigma_cor
    from privdl.accounting.conversion import compose_convert
    from privdl.errors import PrivacyError

    delta = DEFAULT_DELTA
    eps_one = compose_convert(step_rdp * (1 - 1e-9), steps=1, delta=delta, conversion="classic")
    for s in sigma_cdp_grid:
        try:
            cal = calibrate_sigma_cor(
                graph,
                epsilon=eps_one,
                delta=delta,
                steps=1,
                sigma_cdp=float(s),
                clip=clip,
                adversary=adversary,
            )
        except PrivacyError:
            continue
        if sigma_cor_max is None or cal.sigma_cor <= sigma_cor_max:
            return float(s), float(cal.sigma_cor)
    raise ConfigError("no (sigma_cdp, sigma_cor) pair on the grid reaches the target")
