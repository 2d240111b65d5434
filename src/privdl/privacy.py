"""Privacy of a configured run: noise calibration before training, epsilon spent during it.

The unit follows the clipping: ``batch_mean`` clipping of a node's gradient (and the full-gradient
least-squares task) is user-level, ``per_sample`` clipping with a batch mean over ``b`` examples is
example-level with sensitivity ``2C/b`` (replace-one) and amplification by the sampling scheme
(fixed-size without replacement, or Poisson under add/remove) through dp-accounting's RDP
accountant. Each DECOR/LDP step reduces to its equivalent Gaussian mechanism by the SecRDP
accountant (Algorithms 2/3); user-level totals use the paper's classic RDP->DP conversion.

PORTER-DP (Li & Chi, eqs. (6)-(7)) adds ``N(0, sigma_p^2 I)`` to each agent's clipped gradient
and every message it sends is post-processing of those noisy gradients, so it is accounted
exactly as the LDP baseline (threat model ``ldp``). PORTER-GC adds no noise: no guarantee.
PrivSGP (Zhu et al., Algorithm 2) draws ONE table entry (block of ``B`` samples) uniformly from
``J`` per node and step: a fixed-size subsampled Gaussian with replace-one sensitivity ``2C/B``.
PrivSGP-VR (Algorithm 1) has no certified amplification (its SAGA mean depends on every sample
at every step, spec privsgp-vr.md §8.4), so it is accounted WITHOUT subsampling, at the
replace-one sensitivity ``(4 - 2/J) C / B`` of ``g = h - T[xi] + mean(T)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from privdl.errors import ConfigError, PrivacyError

DEFAULT_DELTA = 1e-5
#: Algorithms whose noise is added locally to each node's gradient (same accounting as "ldp").
LOCAL_NOISE = ("ldp", "porter-dp")
#: Algorithms without any privacy noise.
NON_PRIVATE = ("dsgd", "porter-gc")


def _unit(cfg, task) -> str:
    if cfg.algorithm in ("privsgp", "privsgp-vr"):
        return "example"
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
    if cfg.algorithm in (*LOCAL_NOISE, "privsgp", "privsgp-vr"):
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
    adversary = "ldp" if cfg.algorithm in LOCAL_NOISE else cfg.adversary
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
    from privdl.accounting.decor import UNSAMPLED_CAP_NOTE, cap_by_unsampled
    from privdl.accounting.dpsgd import event_epsilon
    from privdl.accounting.events import DecorStepEvent

    if cfg.algorithm in NON_PRIVATE:
        return lambda t: None
    if cfg.algorithm in ("privsgp", "privsgp-vr"):
        return _privsgp_spent(cfg, task, sigma=sigma)
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
        eps, capped = (eps, False) if t == 0 else cap_by_unsampled(eps, rho, steps=t, delta=delta)
        full = rate >= 1.0  # every example in every step: no amplification to label
        return PrivacyBudget(
            epsilon=eps,
            delta=delta,
            accountant="secrdp+rdp" if full else "secrdp+rdp-subsampled",
            neighbouring=neighbouring,
            unit="example",
            threat_model=threat,
            notes=(
                f"full batch (q=1, no subsampling), step_rdp={rho:.6g}"
                if full
                else f"{sampling} sampling q={rate:.4g}, step_rdp={rho:.6g}"
            )
            + (UNSAMPLED_CAP_NOTE if capped else ""),
        ).to_dict()

    return at_example


def calibrate(cfg, topo, task):
    """Return ``cfg`` with ``sigma`` (and for DECOR ``sigma_cor``) set for its target epsilon.

    Without a target (``epsilon`` unset) the config is returned unchanged. The calibration is
    conservative: the accounted epsilon after ``steps`` is at most the target.
    """
    if cfg.epsilon is None or cfg.algorithm == "dsgd":
        return cfg
    if cfg.algorithm == "porter-gc":
        raise ConfigError(
            "porter-gc adds no noise, so no epsilon can be reached; use porter-dp for a target"
        )
    if cfg.clip is None:
        raise ConfigError("a target epsilon needs a clipping threshold (--clip C)")
    delta = cfg.delta if cfg.delta is not None else DEFAULT_DELTA
    if cfg.algorithm in ("privsgp", "privsgp-vr"):
        return cfg.with_updates(sigma=_privsgp_sigma(cfg, task, delta=delta), delta=delta)
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
    if cfg.algorithm in LOCAL_NOISE:
        return cfg.with_updates(sigma=sigma_ldp * (1 + 1e-9), delta=delta)
    if cfg.algorithm == "cdp":
        return cfg.with_updates(sigma=sigma_ldp / math.sqrt(n) * (1 + 1e-9), delta=delta)
    # DECOR: sigma_cdp fixed (given, or a default point of its admissible range), sigma_cor
    # calibrated by bisection so that the SecRDP step slope is at most rho (Alg 2/3).
    from privdl.accounting.calibration import calibrate_sigma_cor, sigma_cdp_range
    from privdl.accounting.conversion import compose_convert

    eps_one_step = compose_convert(rho * (1 - 1e-9), steps=1, delta=delta, conversion="classic")
    one_step = dict(epsilon=eps_one_step, delta=delta, steps=1, clip=c, adversary=cfg.adversary)
    try:
        cal = calibrate_sigma_cor(
            topo.graph, sigma_cdp=cfg.sigma if cfg.sigma > 0 else None, **one_step
        )
    except PrivacyError as exc:
        if cfg.sigma <= 0:
            raise
        # the search ran on the equivalent one-step target: name the user's (eps, T) instead
        lo, hi = sigma_cdp_range(topo.graph, **one_step)
        raise PrivacyError(
            f"sigma = {cfg.sigma:.6g} (sigma_cdp) is too small for epsilon {cfg.epsilon:g} over "
            f"{cfg.steps} steps: no sigma_cor reaches it (need sigma > {lo:.6g}; the LDP level "
            f"is {hi:.6g})"
        ) from exc
    return cfg.with_updates(sigma=cal.sigma_cdp, sigma_cor=cal.sigma_cor, delta=delta)


#: What a run's record says about where its noise keys came from (``key_source``).
KEY_NOTES = {
    "seed": "keys from the seed: a reproducible simulation; whoever knows the seed can rebuild "
    "the noise, so the guarantee holds only against an adversary who does not",
    "os": "noise keys and data sampling from OS randomness",
}


def run_accountant(cfg, topo, task) -> Callable[[int], dict[str, Any] | None]:
    """The privacy-spent function of a built run (noise already calibrated); its records' notes
    say where the noise keys came from (:data:`KEY_NOTES`)."""
    if cfg.algorithm in NON_PRIVATE or cfg.sigma <= 0:
        return lambda t: None
    at = spent(cfg, topo, task, sigma=cfg.sigma, sigma_cor=cfg.sigma_cor)
    key_note = KEY_NOTES[getattr(cfg, "key_source", "seed")]

    def with_key_note(t: int) -> dict[str, Any] | None:
        rec = at(t)
        if rec is not None:
            rec["notes"] = "; ".join(x for x in (rec.get("notes"), key_note) if x)
        return rec

    return with_key_note


# --- PrivSGP / PrivSGP-VR ----------------------------------------------------------------------


def privsgp_geometry(cfg, task) -> tuple[int, int]:
    """``(J, B)``: table entries per node (blocks) and samples per entry of the run's oracle."""
    if getattr(task, "kind", "") == "least-squares":
        return int(cfg.ls_dim), 1  # one entry per row of A_i (tasks.LeastSquaresTask)
    m = int(task.data.counts.min())
    return m // cfg.block_size, int(cfg.block_size)


def privsgp_sensitivity(cfg, task) -> float:
    """Replace-one L2 sensitivity of one step's noisy vector (before noise), example level.

    PrivSGP: ``2C/B`` (the drawn entry is a mean of ``B`` per-sample gradients clipped at C).
    PrivSGP-VR: ``||h - T[xi] + mean T||`` changes by up to ``2C/B + (1 - 1/J) 2C/B`` when the
    example's block is drawn (``T[xi]`` is also one of the mean's J terms) and by ``2C/(B J)``
    otherwise; the worst case is used (:func:`privdl.accounting.nominal.privsgp_vr_sensitivity`).
    """
    from privdl.accounting.nominal import privsgp_vr_sensitivity

    j, b = privsgp_geometry(cfg, task)
    if cfg.algorithm == "privsgp-vr":
        return privsgp_vr_sensitivity(float(cfg.clip), entries=j, block_size=b)
    return 2.0 * float(cfg.clip) / b


def _privsgp_sigma(cfg, task, *, delta: float) -> float:
    """sigma for a target epsilon: subsampled RDP (PrivSGP) or plain composition (VR)."""
    from privdl.accounting.nominal import privsgp_accounted_sigma

    j, b = privsgp_geometry(cfg, task)
    return privsgp_accounted_sigma(
        clip=float(cfg.clip), steps=cfg.steps, delta=delta, entries=j, epsilon=cfg.epsilon,
        block_size=b, variance_reduction=cfg.algorithm == "privsgp-vr",
    )  # fmt: skip


def _privsgp_spent(cfg, task, *, sigma: float) -> Callable[[int], dict[str, Any] | None]:
    from privdl.accounting.budget import PrivacyBudget
    from privdl.accounting.decor import UNSAMPLED_CAP_NOTE, cap_by_unsampled
    from privdl.accounting.dpsgd import event_epsilon
    from privdl.accounting.events import DecorStepEvent
    from privdl.accounting.nominal import privsgp_vr_budget

    if cfg.clip is None:
        raise ConfigError(f"{cfg.algorithm} with noise needs a clipping threshold (--clip C)")
    delta = cfg.delta if cfg.delta is not None else DEFAULT_DELTA
    j, b = privsgp_geometry(cfg, task)
    if cfg.algorithm == "privsgp-vr":
        return lambda t: privsgp_vr_budget(
            sigma=sigma, clip=float(cfg.clip), entries=j, block_size=b, steps=t, delta=delta
        ).to_dict()
    sens = privsgp_sensitivity(cfg, task)
    rho = sens * sens / (2.0 * sigma * sigma)  # replace-one RDP slope of one step
    notes = (
        f"full batch (J=1 entry of B={b}: no subsampling), step_rdp={rho:.6g}"
        if j == 1
        else f"fixed_size sampling of 1 entry of J={j} (B={b}), step_rdp={rho:.6g}"
    )

    def at(t: int) -> dict[str, Any]:
        if t == 0:
            eps = 0.0
        else:
            ev = DecorStepEvent(
                step_rdp=rho,
                steps=t,
                threat_model="ldp",
                sampling_rate=1.0 / j,
                sampling="fixed_size",
                dataset_size=j,
            )
            eps = event_epsilon(ev.as_gaussian("replace_one"), delta=delta, accountant="rdp")
        # one entry of J is a mixture of unsampled steps: never above t of those (as DECOR's,
        # LDP's and PORTER-DP's example-level records)
        eps, capped = (eps, False) if t == 0 else cap_by_unsampled(eps, rho, steps=t, delta=delta)
        return PrivacyBudget(
            epsilon=eps,
            delta=delta,
            accountant="rdp" if j == 1 else "rdp-subsampled",
            neighbouring="replace_one",
            unit="example",
            threat_model="ldp",
            notes=notes + (UNSAMPLED_CAP_NOTE if capped else ""),
        ).to_dict()

    return at


def calibration_record(cfg, topo, task) -> dict[str, Any] | None:
    """The accounted sigma of a calibrated run next to the paper's formula (labelled nominal).

    PORTER-DP: Theorem 1 ``sigma_p = tau sqrt(T ln(1/delta)) / (m eps)`` (b = 1 in the paper).
    PrivSGP(-VR): Theorem 2 eq. (11) with c2 = 1 (the paper leaves c2 unspecified), and for VR
    also the library's Poisson-subsampled approximation (not certified, spec §8.4).
    """
    if cfg.epsilon is None or cfg.algorithm not in ("porter-dp", "privsgp", "privsgp-vr"):
        return None
    delta = cfg.delta if cfg.delta is not None else DEFAULT_DELTA
    priv = run_accountant(cfg, topo, task)(cfg.steps) or {}
    out: dict[str, Any] = {
        "target_epsilon": cfg.epsilon,
        "delta": delta,
        "accounted": {"sigma": cfg.sigma, **priv},
    }
    if cfg.algorithm == "porter-dp":
        if getattr(task, "kind", "") != "supervised":
            return out  # full local gradients: Theorem 1's sampling formula does not apply
        from privdl.accounting.nominal import porter_sigma

        m = int(task.data.counts.min())
        out["nominal"] = {
            "sigma": porter_sigma(
                tau=float(cfg.clip),
                steps=cfg.steps,
                delta=delta,
                local_samples=m,
                epsilon=cfg.epsilon,
            ),  # fmt: skip
            "accountant": "nominal:porter-thm1",
            "nominal": True,
            "notes": f"paper formula with b = 1, m = {m}; not a certified guarantee",
        }
        return out
    from privdl.algorithms.privsgp import noise_plan

    j, _ = privsgp_geometry(cfg, task)
    vr = cfg.algorithm == "privsgp-vr"
    common = dict(
        gradient_bound=float(cfg.clip), steps=cfg.steps, local_samples=j,
        epsilons=cfg.epsilon, deltas=delta, variance_reduction=vr,
    )  # fmt: skip
    nom = noise_plan(mode="nominal", c2=1.0, **common)
    out["nominal"] = {
        "sigma": nom.sigmas[0],
        "accountant": "nominal:privsgp-thm2",
        "nominal": True,
        "notes": nom.notes,
    }
    if vr:
        approx = noise_plan(mode="poisson_approximation", **common)
        out["subsampled_approximation"] = {
            "sigma": approx.sigmas[0],
            "accountant": "rdp-poisson-approx",
            "nominal": True,
            "notes": "Poisson rate 1/J, sensitivity 3C, add/remove: an approximation that "
            "ignores the SAGA mean's dependence on every sample (not certified)",
        }
    return out


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
