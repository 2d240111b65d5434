"""End-to-end DECOR accounting: SecRDP step (Alg 2/3) -> T-fold composition -> (eps, delta).

User level (no sampling): the composed curve is alpha * T * eps_step, the RDP curve of a Gaussian
mechanism with mu = sqrt(2 T eps_step) (the whitened step is a 1-D Gaussian shift), converted by
default with the exact ``gaussian`` conversion (mu-GDP, recorded as ``mu``); ``classic`` (Lemma 11,
the paper's and its code's choice) and ``improved`` stay selectable.

Example level (``sampling_rate`` < 1, DECOR App. D.1; docs/accounting.md section 3): Alg 2/3 runs
with C replaced by C/b, the step is reduced to its equivalent Gaussian (noise multiplier 1/sqrt(2
eps_step), replace-one) and a standard subsampled-Gaussian accountant composes it:

* ``tightest`` (default): the smallest certified of dp-accounting's PLD and RDP
  (:mod:`privdl.accounting.tightest`; PLD where dp-accounting has it: Poisson sampling);
* ``rdp`` / ``pld``: dp-accounting, for (fixed_size, replace_one), (poisson, add_remove) or
  (poisson, replace_one; pld only);
* ``classic``: our Wang et al. (2019) bound for fixed-size sampling, composed over T and converted
  by Lemma 11 (what the paper describes, done correctly);
* ``legacy-uncomposed``: the DECOR reference code's number, min_alpha of ONE subsampled step,
  ignoring T and delta. It is NOT a differential-privacy guarantee (docs/accounting.md, section 6)
  and is labelled so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import networkx as nx
import numpy as np

from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.conversion import (
    CONVERSIONS,
    DEFAULT_CONVERSION,
    UNSAMPLED_CAP_NOTE,
    cap_by_unsampled,
    check_delta,
    compose_convert,
    gaussian_mu,
)
from privdl.accounting.events import DecorStepEvent
from privdl.accounting.rdp_pld import classic_from_curve, wang_fixed_size_rdp
from privdl.accounting.secrdp import (
    MAX_SUBSETS,
    SecRdpStep,
    decor_step_rdp,
    parse_adversary,
    theorem_bound,
)
from privdl.accounting.tightest import TIGHTEST, account_event
from privdl.errors import PrivacyError

SAMPLED_CONVERSIONS = ("tightest", "rdp", "pld", "classic", "legacy-uncomposed")
LEGACY_ORDERS = np.arange(2, 257)


@dataclass(frozen=True)
class DecorAccount:
    """A DECOR privacy statement: the budget plus the quantities it was computed from."""

    budget: PrivacyBudget
    step_rdp: float
    steps: int
    adversary: str
    conversion: str
    method: str
    noise_multiplier: float
    theorem_step_rdp: float | None = None
    worst_colluders: tuple[int, ...] = ()
    worst_node: int = 0
    disconnected: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)

    @property
    def epsilon(self) -> float:
        """The accounted epsilon."""
        return self.budget.epsilon

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict (the CLI's contract keys: epsilon, delta, step_rdp, ...)."""
        out = asdict(self)
        out.pop("budget")
        out["worst_colluders"] = list(self.worst_colluders)
        return {
            "epsilon": self.budget.epsilon,
            "delta": self.budget.delta,
            **out,
            "budget": self.budget.to_dict(),
            "label": self.budget.label(),
        }


def account_decor(
    graph: nx.Graph,
    *,
    sigma_cdp: float,
    sigma_cor: float,
    clip: float = 1.0,
    steps: int,
    delta: float,
    adversary: str = "eavesdropper",
    conversion: str | None = None,
    sampling_rate: float | None = None,
    batch_size: int | None = None,
    sampling: str = "fixed_size",
    neighbouring: str = "replace_one",
    with_bound: bool = False,
    max_subsets: int = MAX_SUBSETS,
    force: bool = False,
    method: str = "auto",
    step: SecRdpStep | None = None,
) -> DecorAccount:
    """(eps, delta)-SecLDP of T DECOR steps against ``adversary`` (DECOR Appendix C; example level
    App. D.1; docs/accounting.md sections 2-3).

    Args:
        graph: communication graph on nodes 0..n-1.
        sigma_cdp, sigma_cor, clip: the DECOR noise stds and clipping threshold C.
        steps: number of iterations T.
        delta: target delta in (0, 1).
        adversary: eavesdropper | curious | collusion:Q | ldp.
        conversion: user level: gaussian (default, exact) | classic | improved; example level:
            tightest (default) | rdp | pld | classic | legacy-uncomposed.
        sampling_rate, batch_size: example level; the per-step sensitivity becomes 2C/b.
        sampling: fixed_size (uniform without replacement) or poisson.
        neighbouring: replace_one (the paper's) or add_remove (example level only).
        with_bound: also report the Theorem 1/6 closed-form slope.
        step: the per-step SecRDP of these very settings, computed before (it does not depend
            on ``steps`` or ``delta``): reused instead of running Alg 2/3 again, e.g. for an
            epsilon-vs-steps curve. Its adversary must be ``adversary``'s.
    """
    adv = parse_adversary(adversary)
    step_clip = step_clip_for(
        clip=clip, steps=steps, delta=delta, sampling_rate=sampling_rate,
        batch_size=batch_size, neighbouring=neighbouring,
    )  # fmt: skip
    if step is None:
        step = decor_step_rdp(
            graph,
            sigma_cdp=sigma_cdp,
            sigma_cor=sigma_cor,
            clip=step_clip,
            adversary=adv,
            max_subsets=max_subsets,
            force=force,
            method=method,
        )
    elif step.adversary != adv.label:
        raise PrivacyError(f"the step given is against {step.adversary}, not {adv.label}")
    bound = None
    if with_bound:
        bound = theorem_bound(
            graph,
            sigma_cdp=sigma_cdp,
            sigma_cor=sigma_cor,
            clip=step_clip,
            adversary=adv,
            max_subsets=max_subsets,
            force=force,
        )
    return compose_step(
        step,
        clip=clip,
        steps=steps,
        delta=delta,
        conversion=conversion,
        sampling_rate=sampling_rate,
        batch_size=batch_size,
        sampling=sampling,
        neighbouring=neighbouring,
        theorem_step_rdp=bound,
    )


def step_clip_for(
    *,
    clip: float,
    steps: int,
    delta: float,
    sampling_rate: float | None,
    batch_size: int | None,
    neighbouring: str,
) -> float:
    """Check a DECOR accounting request (steps, delta, example-level sampling, relation) and
    return the clip of one step's sensitivity: C at user level, C/b at example level."""
    check_delta(delta)
    if int(steps) != steps or steps < 1:
        raise PrivacyError(f"steps must be a positive integer, got {steps}")
    example_level = sampling_rate is not None
    if batch_size is not None and not example_level:
        raise PrivacyError(
            "a batch size is example-level accounting: give the sampling rate b/m with it"
        )
    if example_level:
        if batch_size is None or batch_size < 1:
            raise PrivacyError("example-level accounting needs --batch-size B >= 1")
        if not (0 < cast(float, sampling_rate) <= 1):
            raise PrivacyError(f"sampling rate must lie in (0, 1], got {sampling_rate}")
    elif neighbouring != "replace_one":
        raise PrivacyError("user-level DECOR accounting is replace-one (sensitivity 2C)")
    return clip / cast(int, batch_size) if example_level else clip


def compose_step(
    step: SecRdpStep,
    *,
    clip: float,
    steps: int,
    delta: float,
    conversion: str | None = None,
    sampling_rate: float | None = None,
    batch_size: int | None = None,
    sampling: str = "fixed_size",
    neighbouring: str = "replace_one",
    theorem_step_rdp: float | None = None,
) -> DecorAccount:
    """T steps of a per-step SecRDP ``step`` (Alg 2/3 of DECOR, or of a noise design) composed
    and converted to (eps, delta) (DECOR Appendix C; example level App. D.1)."""
    step_clip_for(
        clip=clip, steps=steps, delta=delta, sampling_rate=sampling_rate,
        batch_size=batch_size, neighbouring=neighbouring,
    )  # fmt: skip
    adv = parse_adversary(step.adversary)
    example_level = sampling_rate is not None
    bound = theorem_step_rdp
    z = 1.0 / math.sqrt(2.0 * step.step_rdp)
    nominal, notes, sampling_info = False, "", {}
    mu: float | None = None
    accountant = ""
    if not example_level:
        conversion = conversion or DEFAULT_CONVERSION
        if conversion not in CONVERSIONS:
            raise PrivacyError(f"user-level conversion must be one of {CONVERSIONS}")
        eps = compose_convert(step.step_rdp, steps=int(steps), delta=delta, conversion=conversion)
        unit = "user"
        notes = "user-level, sensitivity 2C per step"
        if conversion == "gaussian":
            mu = gaussian_mu(steps * step.step_rdp)
            notes += f"; exact: mu-GDP, mu = {mu:.6g}"
    else:
        # example level: both were checked above (sampling rate in (0, 1], batch size >= 1)
        sampling_rate, batch_size = cast(float, sampling_rate), cast(int, batch_size)
        conversion = conversion or TIGHTEST
        if conversion not in SAMPLED_CONVERSIONS:
            raise PrivacyError(f"example-level conversion must be one of {SAMPLED_CONVERSIONS}")
        dataset_size = max(batch_size, round(batch_size / sampling_rate))
        if batch_size / dataset_size < sampling_rate * (1 - 1e-12):
            dataset_size -= 1  # never account a smaller rate than the one stated
        event = DecorStepEvent(
            step_rdp=step.step_rdp,
            steps=int(steps),
            threat_model=adv.label,
            sampling_rate=sampling_rate,
            sampling=sampling,
            dataset_size=dataset_size,
        )
        sampling_info = {
            "sampling_rate": sampling_rate,
            "batch_size": batch_size,
            "dataset_size": dataset_size,
            "sampling": sampling,
            "neighbouring": neighbouring,
        }
        unit = "example"
        if conversion in ("tightest", "rdp", "pld"):
            got = account_event(event.as_gaussian(neighbouring), delta=delta, accountant=conversion)
            eps, accountant, mu = got.epsilon, got.accountant, got.mu
            z = event.noise_multiplier(neighbouring)
            notes = (
                f"equivalent Gaussian, full batch (q=1: no subsampling), {neighbouring}"
                if event.sampling_rate >= 1.0
                else f"equivalent subsampled Gaussian, {sampling} sampling, {neighbouring}"
            ) + (f"; {got.notes}" if conversion == TIGHTEST else "")
            eps, capped = cap_by_unsampled(eps, step.step_rdp, steps=int(steps), delta=delta)
            if capped:
                notes += UNSAMPLED_CAP_NOTE
                accountant = "gaussian-unsampled-cap"
                mu = gaussian_mu(steps * step.step_rdp)  # the cap is this mu-GDP's exact epsilon
        else:
            if sampling != "fixed_size" or neighbouring != "replace_one":
                raise PrivacyError(
                    f"conversion {conversion} is the Wang et al. bound: fixed_size + replace_one"
                )
            curve = wang_fixed_size_rdp(step.step_rdp, sampling_rate, LEGACY_ORDERS)
            if conversion == "classic":
                # subsampling never hurts (Renyi divergence is jointly quasi-convex): where the
                # general bound exceeds the unsampled Gaussian's, the unsampled one holds, per
                # integer order and as the continuous-order classic conversion of T steps
                curve = np.minimum(curve, LEGACY_ORDERS * step.step_rdp)
                eps, _ = cap_by_unsampled(
                    classic_from_curve(LEGACY_ORDERS, steps * curve, delta),
                    step.step_rdp,
                    steps=int(steps),
                    delta=delta,
                )
                notes = (
                    "Wang et al. 2019 bound (capped by the unsampled Gaussian's), integer orders "
                    "<= 256, composed, Lemma 11"
                )
            else:
                eps = float(np.min(curve))
                nominal = True
                notes = (
                    "LEGACY: DECOR code's per-step subsampled RDP value; ignores T and delta; "
                    "NOT a DP guarantee"
                )
    notes += step.bound_note  # a certified upper bound, not the exact value
    budget = PrivacyBudget(
        epsilon=eps,
        delta=delta,
        accountant=f"secrdp+{accountant or conversion}",
        neighbouring=neighbouring,
        unit=unit,
        threat_model=adv.label,
        nominal=nominal,
        notes=notes,
        mu=mu,
    )
    return DecorAccount(
        budget=budget,
        step_rdp=step.step_rdp,
        steps=int(steps),
        adversary=adv.label,
        conversion=conversion,
        method=step.method,
        noise_multiplier=z,
        theorem_step_rdp=bound,
        worst_colluders=step.worst_colluders,
        worst_node=step.worst_node,
        disconnected=step.disconnected,
        sampling=sampling_info,
    )
