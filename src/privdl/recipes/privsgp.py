"""PrivSGP-VR and PrivSGP (Zhu et al., IJCAI 2024): private stochastic gradient push.

A :class:`PrivSGPRecipe` instance is PrivSGP-VR (``variance_reduction=True``, Algorithm 1, a SAGA
table per node) or PrivSGP (Algorithm 2). Each step draws ONE table entry (a block of ``B``
samples) per node. Privacy, example level, replace-one, threat model ``ldp``:

* PrivSGP: one entry of ``J`` drawn uniformly, a fixed-size subsampled Gaussian with sensitivity
  ``2C/B``;
* PrivSGP-VR: no certified amplification (its SAGA mean depends on every sample at every step),
  so it is accounted WITHOUT subsampling, at the sensitivity ``(4 - 2/J) C / B`` of
  ``g = h - T[xi] + mean(T)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from pydantic import Field

from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.conversion import (
    UNSAMPLED_CAP_CLASSIC_NOTE,
    UNSAMPLED_CAP_NOTE,
    cap_by_unsampled,
    gaussian_mu,
)
from privdl.accounting.events import DecorStepEvent
from privdl.accounting.nominal import (
    privsgp_accounted_sigma,
    privsgp_vr_budget,
    privsgp_vr_sensitivity,
)
from privdl.accounting.rdp_pld import event_epsilon
from privdl.accounting.tightest import tightest_epsilon
from privdl.algorithms.base import StepSize
from privdl.algorithms.privsgp import PrivSGP, noise_plan
from privdl.config import CommonConfig
from privdl.errors import ConfigError
from privdl.privacy import accountant_of, target_delta, user_conversion, with_key_note
from privdl.recipes.base import Run
from privdl.recipes.decentralized import DecentralizedConfig, DecentralizedRecipe

__all__ = ["PrivSGPConfig", "PrivSGPRecipe", "privsgp_geometry", "privsgp_sensitivity"]


class PrivSGPConfig(DecentralizedConfig):
    """Options of the PrivSGP family: samples per SAGA table entry."""

    block_size: int = Field(
        default=1, ge=1, description="PrivSGP-VR samples per SAGA table entry (block)."
    )


def privsgp_geometry(cfg: Any, task: Any) -> tuple[int, int]:
    """``(J, B)``: table entries per node (blocks) and samples per entry of the run's oracle."""
    if getattr(task, "kind", "") == "least-squares":
        return int(cfg.ls_dim), 1  # one entry per row of A_i (tasks.LeastSquaresTask)
    m = int(task.data.counts.min())
    return m // cfg.block_size, int(cfg.block_size)


def privsgp_sensitivity(cfg: Any, task: Any, *, variance_reduction: bool) -> float:
    """Replace-one L2 sensitivity of one step's noisy vector (before noise), example level.

    PrivSGP: ``2C/B`` (the drawn entry is a mean of ``B`` per-sample gradients clipped at C).
    PrivSGP-VR: ``||h - T[xi] + mean T||`` changes by up to ``2C/B + (1 - 1/J) 2C/B`` when the
    example's block is drawn (``T[xi]`` is also one of the mean's J terms) and by ``2C/(B J)``
    otherwise; the worst case is used (:func:`privdl.accounting.nominal.privsgp_vr_sensitivity`).
    """
    j, b = privsgp_geometry(cfg, task)
    if variance_reduction:
        return privsgp_vr_sensitivity(float(cfg.clip), entries=j, block_size=b)
    return 2.0 * float(cfg.clip) / b


class PrivSGPRecipe(DecentralizedRecipe):
    """PrivSGP-VR (``variance_reduction=True``) or PrivSGP; module docstring."""

    config_model: ClassVar[type[CommonConfig]] = PrivSGPConfig
    push_sum: ClassVar[bool] = True

    def __init__(self, *, variance_reduction: bool) -> None:
        self.variance_reduction = variance_reduction

    def resolve(self, cfg: Any, given: Mapping[str, Any]) -> Any:
        default = {k: f.default for k, f in type(cfg).model_fields.items()}
        drawn = [k for k in ("batch_size", "sampling") if k in given and given[k] != default[k]]
        if drawn:
            raise ConfigError(
                f"{cfg.algorithm} draws one table entry of block_size samples per node and step "
                f"(Algorithm 1): drop {', '.join(drawn)}, or set block_size"
            )
        if cfg.clip_mode == "batch_mean":
            raise ConfigError(f"{cfg.algorithm} clips per sample: use clip_mode per_sample")
        return super().resolve(cfg, given)

    def calibrate(self, cfg: Any, topology: Any, task: Any) -> Any:
        if cfg.epsilon is not None and cfg.sigma > 0:
            raise ConfigError("give either a target epsilon or an explicit sigma, not both")
        if cfg.epsilon is None:
            return cfg
        if cfg.clip is None:
            raise ConfigError("a target epsilon needs a clipping threshold (--clip C)")
        delta = target_delta(cfg)
        j, b = privsgp_geometry(cfg, task)
        sigma = privsgp_accounted_sigma(
            clip=float(cfg.clip), steps=cfg.steps, delta=delta, entries=j, epsilon=cfg.epsilon,
            block_size=b, variance_reduction=self.variance_reduction,
            accountant=accountant_of(cfg),
        )  # fmt: skip
        return cfg.with_updates(sigma=sigma, delta=delta)

    def algorithm(self, cfg: Any, topology: Any, task: Any) -> PrivSGP:
        """PrivSGP-VR (Algorithm 1) or PrivSGP (Algorithm 2)."""
        if cfg.sigma > 0 and cfg.clip is None:
            raise ConfigError(f"{cfg.algorithm} with noise needs a clipping threshold (--clip C)")
        return PrivSGP(
            StepSize(cfg.lr, cfg.lr_decay),
            sigmas=cfg.sigma,
            variance_reduction=self.variance_reduction,
            noise_backend=cfg.noise_backend,
        )

    def oracle(self, cfg: Any, task: Any, algorithm: Any, nodes: list[int]) -> Any:
        """The task's sample oracle (table entries of ``block_size`` samples) of ``nodes``."""
        return task.sample_oracle(clip=cfg.clip, block_size=cfg.block_size, nodes=nodes)

    def accountant(self, cfg: Any, topology: Any, task: Any, algorithm: Any) -> Any:
        if cfg.sigma <= 0:
            return None
        return with_key_note(self._spent(cfg, task), cfg.key_source)

    def _spent(self, cfg: Any, task: Any) -> Callable[[int], dict[str, Any]]:
        delta = target_delta(cfg)
        j, b = privsgp_geometry(cfg, task)
        sigma = cfg.sigma
        if self.variance_reduction:
            conversion = user_conversion(cfg)
            return lambda t: privsgp_vr_budget(
                sigma=sigma, clip=float(cfg.clip), entries=j, block_size=b, steps=t, delta=delta,
                conversion=conversion,
            ).to_dict()  # fmt: skip
        sens = privsgp_sensitivity(cfg, task, variance_reduction=False)
        rho = sens * sens / (2.0 * sigma * sigma)  # replace-one RDP slope of one step
        notes = (
            f"full batch (J=1 entry of B={b}: no subsampling), step_rdp={rho:.6g}"
            if j == 1
            else f"fixed_size sampling of 1 entry of J={j} (B={b}), step_rdp={rho:.6g}"
        )

        tight = accountant_of(cfg) == "tightest"

        def at(t: int) -> dict[str, Any]:
            accountant, mu, more = ("gaussian" if j == 1 else "tightest"), None, ""
            if not tight:  # privdl 0.1's accounting and labels
                accountant = "rdp" if j == 1 else "rdp-subsampled"
            if t == 0:
                eps = 0.0
            elif not tight:
                ev = DecorStepEvent(
                    step_rdp=rho, steps=t, threat_model="ldp", sampling_rate=1.0 / j,
                    sampling="fixed_size", dataset_size=j,
                )  # fmt: skip
                eps = event_epsilon(ev.as_gaussian("replace_one"), delta=delta, accountant="rdp")
                eps, capped = cap_by_unsampled(eps, rho, steps=t, delta=delta, conversion="classic")
                more = UNSAMPLED_CAP_CLASSIC_NOTE if capped else ""
                return PrivacyBudget(
                    epsilon=eps, delta=delta, accountant=accountant, neighbouring="replace_one",
                    unit="example", threat_model="ldp", notes=notes + more,
                ).to_dict()  # fmt: skip
            else:
                ev = DecorStepEvent(
                    step_rdp=rho,
                    steps=t,
                    threat_model="ldp",
                    sampling_rate=1.0 / j,
                    sampling="fixed_size",
                    dataset_size=j,
                )
                got = tightest_epsilon(ev.as_gaussian("replace_one"), delta=delta)
                eps, accountant, mu, more = got.epsilon, got.accountant, got.mu, f"; {got.notes}"
            # one entry of J is a mixture of unsampled steps: never above t of those (as the
            # example-level records of the gossip and PORTER families)
            eps, capped = (
                (eps, False) if t == 0 else cap_by_unsampled(eps, rho, steps=t, delta=delta)
            )
            if capped:
                accountant, mu = "gaussian-unsampled-cap", gaussian_mu(rho * t)
                more += UNSAMPLED_CAP_NOTE
            return PrivacyBudget(
                epsilon=eps,
                delta=delta,
                accountant=accountant,
                neighbouring="replace_one",
                unit="example",
                threat_model="ldp",
                notes=notes + more,
                mu=mu,
            ).to_dict()

        return at

    def calibration_record(self, run: Run) -> dict[str, Any] | None:
        """The accounted sigma beside Theorem 2 eq. (11) with c2 = 1 (the paper leaves c2
        unspecified; nominal) and, for VR, the Poisson-subsampled approximation (not certified)."""
        cfg, task = run.cfg, run.task
        if cfg.epsilon is None:
            return None
        delta = target_delta(cfg)
        out = run.accounted_record(delta)
        j, _ = privsgp_geometry(cfg, task)
        vr = self.variance_reduction
        common = dict(
            gradient_bound=float(cfg.clip), steps=cfg.steps, local_samples=j,
            epsilons=cfg.epsilon, deltas=delta, variance_reduction=vr,
        )  # fmt: skip
        nom = noise_plan(mode="nominal", c2=1.0, **common)  # type: ignore[arg-type]
        out["nominal"] = {
            "sigma": nom.sigmas[0],
            "accountant": "nominal:privsgp-thm2",
            "nominal": True,
            "notes": nom.notes,
        }
        if vr:
            approx = noise_plan(mode="poisson_approximation", **common)  # type: ignore[arg-type]
            out["subsampled_approximation"] = {
                "sigma": approx.sigmas[0],
                "accountant": "rdp-poisson-approx",
                "nominal": True,
                "notes": "Poisson rate 1/J, sensitivity 3C, add/remove: an approximation that "
                "ignores the SAGA mean's dependence on every sample (not certified)",
            }
        return out
