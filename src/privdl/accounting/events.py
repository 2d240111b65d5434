"""Event records: what happened, kept separate from how it is bounded (dp-accounting style).

Events are immutable; their meaning never changes. Accountants (``dpsgd``, ``decor``) turn them
into :class:`~privdl.accounting.budget.PrivacyBudget` values.

Noise multipliers are relative to the sensitivity of the stated neighbouring relation: for
``replace_one`` the sensitivity of a sum of C-clipped vectors is 2C, for ``add_remove`` it is C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import dp_accounting as dpa

from privdl.errors import PrivacyError

SAMPLINGS = ("none", "poisson", "fixed_size")
NEIGHBOURINGS = ("add_remove", "replace_one")


@dataclass(frozen=True)
class SubsampledGaussianEvent:
    """``steps`` rounds of a (subsampled) Gaussian mechanism, e.g. one node's DP-SGD.

    Attributes:
        noise_multiplier: noise std divided by the sensitivity of ``neighbouring``.
        sampling_rate: probability (Poisson) or batch/dataset (fixed size); 1 = no sampling.
        steps: number of compositions T.
        sampling: ``poisson``, ``fixed_size`` (uniform without replacement) or ``none``.
        neighbouring: ``add_remove`` or ``replace_one``.
        dataset_size: records per node; required for ``fixed_size``.
    """

    noise_multiplier: float
    sampling_rate: float
    steps: int
    sampling: str = "poisson"
    neighbouring: str = "add_remove"
    dataset_size: int | None = None

    def __post_init__(self) -> None:
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise PrivacyError(f"noise multiplier must be > 0, got {self.noise_multiplier}")
        if not (0 < self.sampling_rate <= 1):
            raise PrivacyError(f"sampling rate must lie in (0, 1], got {self.sampling_rate}")
        if int(self.steps) != self.steps or self.steps < 1:
            raise PrivacyError(f"steps must be a positive integer, got {self.steps}")
        if self.sampling not in SAMPLINGS:
            raise PrivacyError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if self.neighbouring not in NEIGHBOURINGS:
            raise PrivacyError(
                f"neighbouring must be one of {NEIGHBOURINGS}, got {self.neighbouring!r}"
            )
        if self.sampling == "none" and self.sampling_rate != 1.0:
            raise PrivacyError("sampling 'none' needs sampling_rate = 1")
        if self.sampling == "fixed_size" and self.dataset_size is None:
            raise PrivacyError("fixed-size sampling needs the dataset size (records per node)")
        if self.dataset_size is not None and (
            isinstance(self.dataset_size, bool)
            or int(self.dataset_size) != self.dataset_size
            or not self.dataset_size >= 1
        ):
            raise PrivacyError(f"dataset size must be a positive integer, got {self.dataset_size}")

    @property
    def batch_size(self) -> int | None:
        """Batch size of fixed-size sampling: sampling_rate * dataset_size, rounded, and up where
        a stated rate is not b / N (a smaller batch would account a smaller rate than stated)."""
        if self.dataset_size is None:
            return None
        b = max(1, round(self.sampling_rate * self.dataset_size))
        if b / self.dataset_size < self.sampling_rate * (1 - 1e-12):
            b += 1
        return min(b, int(self.dataset_size))

    def to_dp_event(self) -> dpa.DpEvent:
        """The equivalent dp-accounting event."""
        gaussian = dpa.GaussianDpEvent(self.noise_multiplier)
        if self.sampling == "none" or self.sampling_rate == 1.0:
            inner: dpa.DpEvent = gaussian
        elif self.sampling == "poisson":
            inner = dpa.PoissonSampledDpEvent(self.sampling_rate, gaussian)
        else:
            # fixed_size: __post_init__ checked that the dataset size (so the batch size) is set
            inner = dpa.SampledWithoutReplacementDpEvent(
                int(cast(int, self.dataset_size)), int(cast(int, self.batch_size)), gaussian
            )
        return dpa.SelfComposedDpEvent(inner, int(self.steps))


@dataclass(frozen=True)
class DecorStepEvent:
    """``steps`` DECOR iterations reduced to their equivalent Gaussian mechanism
    (docs/accounting.md section 3).

    Sigma is common to both hypotheses, so after whitening one step is a 1-D Gaussian shift with
    replace-one noise multiplier z = 1/sqrt(2 step_rdp); under add/remove the sensitivity halves
    (C instead of 2C) and z doubles.

    Attributes:
        step_rdp: Alg 2/3 slope at the replace-one sensitivity (C, or C/b at example level).
        steps: number of iterations T.
        threat_model: ``eavesdropper``, ``curious``, ``collusion:q`` or ``ldp``.
        sampling_rate, sampling, dataset_size: example-level subsampling of each user's batch.
    """

    step_rdp: float
    steps: int
    threat_model: str
    sampling_rate: float = 1.0
    sampling: str = "none"
    dataset_size: int | None = None

    def noise_multiplier(self, neighbouring: str = "replace_one") -> float:
        """Equivalent Gaussian noise multiplier for the given neighbouring relation."""
        z = 1.0 / math.sqrt(2.0 * self.step_rdp)
        return z if neighbouring == "replace_one" else 2.0 * z

    def as_gaussian(self, neighbouring: str = "replace_one") -> SubsampledGaussianEvent:
        """The equivalent (subsampled) Gaussian event."""
        return SubsampledGaussianEvent(
            noise_multiplier=self.noise_multiplier(neighbouring),
            sampling_rate=self.sampling_rate,
            steps=self.steps,
            sampling=self.sampling,
            neighbouring=neighbouring,
            dataset_size=self.dataset_size,
        )
