"""Privacy of a configured run: noise calibration before training, epsilon spent during it.

These functions serve every recipe whose noise is Gaussian noise added to clipped gradients; what
they need to know of an algorithm is its *noise kind*, not its name:

* ``"local"`` — each node adds ``N(0, sigma^2 I)`` to its own clipped gradient and everything it
  sends is post-processing of that (DECOR's LDP baseline; PORTER-DP, Li & Chi eqs. (6)-(7));
  threat model ``ldp``;
* ``"central"`` — the average of the nodes' clipped gradients plus noise of std
  ``sigma/sqrt(n)`` (DECOR's CDP baseline with exact averaging W = J; plain DP-SGD with a trusted
  aggregator); threat model ``central``;
* ``"correlated"`` — DECOR (Allouah et al., ICML 2024, eq. 3): independent noise ``sigma_cdp``
  plus pairwise-cancelling noise ``sigma_cor`` on every edge, accounted per threat model
  (eavesdropper, curious node, q colluders) by the SecRDP accountant (Algorithms 2/3).

The unit follows the clipping: ``batch_mean`` clipping of a node's gradient (and the full-gradient
least-squares task) is user-level, ``per_sample`` clipping with a batch mean over ``b`` examples is
example-level with sensitivity ``2C/b`` (replace-one) and amplification by the sampling scheme
(fixed-size without replacement, or Poisson under add/remove) through dp-accounting's RDP
accountant. Each step reduces to its equivalent Gaussian mechanism. The accounting is the tightest
certified by default: user-level totals are exactly a Gaussian mechanism (mu-GDP, recorded as
``mu``) converted exactly; example-level totals take the smaller of dp-accounting's PLD and RDP
(:mod:`privdl.accounting.tightest`), and calibration inverts the same accountant.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.calibration import calibrate_sigma_cor, sigma_cdp_range
from privdl.accounting.conversion import (
    DEFAULT_CONVERSION,
    UNSAMPLED_CAP_CLASSIC_NOTE,
    UNSAMPLED_CAP_NOTE,
    cap_by_unsampled,
    compose_convert,
    gaussian_mu,
    step_rdp_for_epsilon,
)
from privdl.accounting.dpsgd import calibrate_noise_multiplier, event_epsilon, wang_fixed_size_rdp
from privdl.accounting.events import DecorStepEvent
from privdl.accounting.secrdp import decor_step_rdp
from privdl.accounting.tightest import tightest_epsilon
from privdl.errors import ConfigError, PrivacyError

DEFAULT_DELTA = 1e-5

NoiseKind = Literal["local", "central", "correlated"]
#: The threat model each noise kind is accounted against ("correlated": the run's adversary).
THREAT = {"local": "ldp", "central": "central"}


def accountant_of(cfg: Any) -> str:
    """The run's accountant choice: ``tightest`` (default) or ``rdp`` (privdl 0.1's)."""
    return str(getattr(cfg, "accountant", "tightest"))


def user_conversion(cfg: Any) -> str:
    """The RDP -> (eps, delta) conversion of user-level totals: exact unless ``rdp`` was asked."""
    return DEFAULT_CONVERSION if accountant_of(cfg) == "tightest" else "classic"


def target_delta(cfg: Any) -> float:
    """The run's delta (its target, or the default 1e-5)."""
    return cfg.delta if cfg.delta is not None else DEFAULT_DELTA


def privacy_unit(cfg: Any, task: Any) -> str:
    """``example`` for per-sample clipping of sampled minibatches of a dataset, else ``user``."""
    if (
        cfg.clip_mode == "per_sample"
        and getattr(task, "kind", "") == "supervised"
        and cfg.sampling != "full"
    ):
        return "example"
    return "user"


def threat_model(noise: NoiseKind, adversary: str) -> str:
    """The threat model a noise kind is accounted against."""
    return THREAT.get(noise, adversary)


def example_sampling(cfg: Any, task: Any) -> tuple[str, str, float, int]:
    """(dp-accounting sampling, neighbouring, rate, records per node) of example-level runs;
    the rate is the smallest node's (the worst case)."""
    m = int(task.data.counts.min())
    rate = min(1.0, cfg.batch_size / m)
    if cfg.sampling == "poisson":
        return "poisson", "add_remove", rate, m
    return "fixed_size", "replace_one", rate, m


def step_rdp(
    cfg: Any,
    topo: Any,
    task: Any,
    *,
    noise: NoiseKind,
    adversary: str = "eavesdropper",
    sigma: float,
    sigma_cor: float = 0.0,
    design: Any = None,
) -> float:
    """Per-step RDP slope at the replace-one sensitivity of the run's privacy unit (``design``:
    a :class:`~privdl.mechanisms.noise_design.NoiseDesign` or a trusted dealer's
    :class:`~privdl.mechanisms.dealer.DealerCovariance` instead of the two sigmas)."""
    return _step(
        cfg, topo, task, noise=noise, adversary=adversary, sigma=sigma, sigma_cor=sigma_cor,
        design=design,
    )[0]  # fmt: skip


def _step(
    cfg: Any,
    topo: Any,
    task: Any,
    *,
    noise: NoiseKind,
    adversary: str,
    sigma: float,
    sigma_cor: float,
    design: Any,
) -> tuple[float, str]:
    """:func:`step_rdp` and the note its record carries: where the SecRDP accountant returned a
    certified upper bound (``gauss-radau:K``, docs/accounting.md section 1) rather than the exact
    value, the note says so (as :func:`privdl.accounting.decor.account_decor` does)."""
    c = float(cfg.clip)
    if privacy_unit(cfg, task) == "example":
        c = c / cfg.batch_size
    if design is not None:
        from privdl.accounting.design import design_step_rdp

        return float(design_step_rdp(topo, design, clip=c, adversary=adversary).step_rdp), ""
    if noise == "central":
        return 2.0 * c * c / (topo.n * sigma * sigma), ""
    step = decor_step_rdp(
        topo.graph,
        sigma_cdp=sigma,
        sigma_cor=sigma_cor,
        clip=c,
        adversary="ldp" if noise == "local" else adversary,
    )
    return float(step.step_rdp), step.bound_note


def spent(
    cfg: Any,
    topo: Any,
    task: Any,
    *,
    noise: NoiseKind,
    adversary: str = "eavesdropper",
    sigma: float,
    sigma_cor: float = 0.0,
    design: Any = None,
) -> Callable[[int], dict[str, Any]]:
    """``t -> labelled (epsilon, delta)`` after ``t`` steps."""
    delta = target_delta(cfg)
    unit = privacy_unit(cfg, task)
    threat = threat_model(noise, adversary)
    if design is not None:  # (imported here: the accountants load without the noise code)
        from privdl.mechanisms.dealer import DealerCovariance, dealer_threat

        if isinstance(design, DealerCovariance):  # Whisper's noise: the dealer sees it all
            threat = dealer_threat(threat)
    rho, bound_note = _step(
        cfg, topo, task, noise=noise, adversary=adversary, sigma=sigma, sigma_cor=sigma_cor,
        design=design,
    )  # fmt: skip

    tight = accountant_of(cfg) == "tightest"
    if unit == "user":
        conversion = user_conversion(cfg)

        def at(t: int) -> dict[str, Any]:
            eps = (
                0.0 if t == 0 else compose_convert(rho, steps=t, delta=delta, conversion=conversion)
            )
            return PrivacyBudget(
                epsilon=eps,
                delta=delta,
                accountant=f"secrdp+{conversion}",
                neighbouring="replace_one",
                unit="user",
                threat_model=threat,
                notes=f"step_rdp={rho:.6g}" + ("; exact: mu-GDP" if tight else "") + bound_note,
                mu=gaussian_mu(rho * t),
            ).to_dict()

        return at

    sampling, neighbouring, rate, m = example_sampling(cfg, task)

    def at_example(t: int) -> dict[str, Any]:
        full = rate >= 1.0  # every example in every step: no amplification to label
        notes = (
            f"full batch (q=1, no subsampling), step_rdp={rho:.6g}"
            if full
            else f"{sampling} sampling q={rate:.4g}, step_rdp={rho:.6g}"
        )
        eps, mu = 0.0, None
        if tight:
            accountant = "gaussian" if full else "tightest"
        else:  # privdl 0.1's labels and numbers
            accountant = "rdp" if full else "rdp-subsampled"
        if t > 0:
            event = DecorStepEvent(
                step_rdp=rho,
                steps=t,
                threat_model=threat,
                sampling_rate=rate,
                sampling=sampling,
                dataset_size=m,
            ).as_gaussian(neighbouring)
            if tight:
                got = tightest_epsilon(event, delta=delta)
                eps, accountant, mu = got.epsilon, got.accountant, got.mu
                notes += f"; {got.notes}"
            else:
                eps = event_epsilon(event, delta=delta, accountant="rdp")
            cap = "gaussian" if tight else "classic"
            eps, capped = cap_by_unsampled(eps, rho, steps=t, delta=delta, conversion=cap)
            if capped and tight:
                accountant, mu = "gaussian-unsampled-cap", gaussian_mu(rho * t)
            if capped:
                notes += UNSAMPLED_CAP_NOTE if tight else UNSAMPLED_CAP_CLASSIC_NOTE
        notes += bound_note
        return PrivacyBudget(
            epsilon=eps,
            delta=delta,
            accountant=f"secrdp+{accountant}",
            neighbouring=neighbouring,
            unit="example",
            threat_model=threat,
            notes=notes,
            mu=mu,
        ).to_dict()

    return at_example


def calibrate_noise(
    cfg: Any, topo: Any, task: Any, *, noise: NoiseKind, adversary: str = "eavesdropper"
) -> dict[str, float]:
    """The noise levels that meet ``cfg.epsilon`` after ``cfg.steps`` steps: ``sigma`` (and for
    correlated noise ``sigma_cor``) and the ``delta`` used.

    The calibration is conservative: the accounted epsilon after ``steps`` is at most the target.
    Correlated noise: ``sigma_cdp`` is fixed (``cfg.sigma`` if given, else a default point of its
    admissible range) and ``sigma_cor`` calibrated by bisection so that the SecRDP step slope is at
    most the target's (Alg 2/3).
    """
    if cfg.clip is None:
        raise ConfigError("a target epsilon needs a clipping threshold (--clip C)")
    delta = target_delta(cfg)
    unit = privacy_unit(cfg, task)
    c = float(cfg.clip) / (cfg.batch_size if unit == "example" else 1)
    if unit == "user":
        rho = step_rdp_for_epsilon(
            cfg.epsilon, steps=cfg.steps, delta=delta, conversion=user_conversion(cfg)
        )
    else:
        sampling, neighbouring, rate, m = example_sampling(cfg, task)
        z = calibrate_noise_multiplier(
            target_epsilon=cfg.epsilon,
            sampling_rate=rate,
            steps=cfg.steps,
            delta=delta,
            accountant=accountant_of(cfg),
            sampling=sampling,
            neighbouring=neighbouring,
            dataset_size=m,
        )
        # the equivalent replace-one slope 1/(2 z_r^2); z_r = z (replace) or z/2 (add/remove)
        z_r = z if neighbouring == "replace_one" else z / 2.0
        rho = 1.0 / (2.0 * z_r * z_r)
    sigma_ldp = c * math.sqrt(2.0 / rho)
    if noise == "local":
        return {"sigma": sigma_ldp * (1 + 1e-9), "delta": delta}
    if noise == "central":
        return {"sigma": sigma_ldp / math.sqrt(topo.n) * (1 + 1e-9), "delta": delta}
    # the slope target rho, handed to the sigma_cor search as a one-step epsilon of the classic
    # conversion (a monotone relabelling of rho, not an accountant choice)
    eps_one_step = compose_convert(rho * (1 - 1e-9), steps=1, delta=delta, conversion="classic")
    one_step: dict[str, Any] = dict(
        epsilon=eps_one_step,
        delta=delta,
        steps=1,
        clip=c,
        adversary=adversary,
        conversion="classic",
    )
    given = cfg.sigma if cfg.sigma > 0 else None
    try:
        cal = calibrate_sigma_cor(topo.graph, sigma_cdp=given, **one_step)
    except PrivacyError as exc:
        if given is None:
            raise
        # the search ran on the equivalent one-step target: name the user's (eps, T) instead
        lo, hi = sigma_cdp_range(topo.graph, **one_step)
        raise PrivacyError(
            f"sigma = {cfg.sigma:.6g} (sigma_cdp) is too small for epsilon {cfg.epsilon:g} over "
            f"{cfg.steps} steps: no sigma_cor reaches it (need sigma > {lo:.6g}; the LDP level "
            f"is {hi:.6g})"
        ) from exc
    return {"sigma": cal.sigma_cdp, "sigma_cor": cal.sigma_cor, "delta": delta}


#: What a run's record says about where its noise keys came from (``key_source``).
KEY_NOTES = {
    "seed": "keys from the seed: a reproducible simulation; whoever knows the seed can rebuild "
    "the noise, so the guarantee holds only against an adversary who does not",
    "os": "noise keys and data sampling from OS randomness",
}


def with_key_note(
    at: Callable[[int], dict[str, Any] | None], key_source: str
) -> Callable[[int], dict[str, Any] | None]:
    """``at`` whose records' notes say where the noise keys came from (:data:`KEY_NOTES`)."""
    key_note = KEY_NOTES[key_source]

    def noted(t: int) -> dict[str, Any] | None:
        rec = at(t)
        if rec is not None:
            rec["notes"] = "; ".join(x for x in (rec.get("notes"), key_note) if x)
        return rec

    return noted


# --- reproduction helpers (DECOR App. D.1, docs/accounting.md) ------------------------------

LEGACY_LABEL = "legacy, not a valid (eps, delta) guarantee"


def legacy_example_epsilon(step_rdp: float, *, sampling_rate: float) -> float:
    """The DECOR reference code's example-level "epsilon" (docs/accounting.md, LEGACY).

    min over integer alpha in [2, 256] of the Wang et al. (2019) subsampled RDP bound of ONE step:
    T and delta are ignored, so this is NOT a differential-privacy guarantee. It is what the
    paper's MNIST budgets {1e-3, 1e-2, 0.1, 1} (Fig 1c, Fig 3) measure.
    """
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
    search succeeds" (DECOR App. D.1), made conservative.
    """
    delta = DEFAULT_DELTA
    eps_one = compose_convert(step_rdp * (1 - 1e-9), steps=1, delta=delta, conversion="classic")
    for s in sigma_cdp_grid:
        try:
            cal = calibrate_sigma_cor(
                graph,
                epsilon=eps_one,
                delta=delta,
                steps=1,
                conversion="classic",
                sigma_cdp=float(s),
                clip=clip,
                adversary=adversary,
            )
        except PrivacyError:
            continue
        if sigma_cor_max is None or cal.sigma_cor <= sigma_cor_max:
            return float(s), float(cal.sigma_cor)
    raise ConfigError("no (sigma_cdp, sigma_cor) pair on the grid reaches the target")
