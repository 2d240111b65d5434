"""The labelled privacy result that every epsilon printed by privdl carries.

An epsilon alone is meaningless: it needs its delta, the accountant that produced it, the
neighbouring relation, the privacy unit and the threat model. A paper's closed-form noise
formula that is not backed by an accountant is marked ``nominal=True``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from privdl.errors import PrivacyError

NEIGHBOURINGS = ("replace_one", "add_remove")
UNITS = ("example", "user")


@dataclass(frozen=True)
class PrivacyBudget:
    """An (epsilon, delta) guarantee together with how and against whom it was obtained.

    Attributes:
        epsilon: the privacy loss bound (``inf`` when no finite bound exists).
        delta: the failure probability, in (0, 1).
        accountant: how the bound was computed, e.g. ``"secrdp+classic"``, ``"rdp"``, ``"pld"``,
            ``"nominal:privsgp-thm2"``.
        neighbouring: ``"replace_one"`` or ``"add_remove"``.
        unit: ``"example"`` (one record changes) or ``"user"`` (a user's whole data changes).
        threat_model: ``"eavesdropper"``, ``"curious"``, ``"collusion:q"``, ``"ldp"``,
            ``"central"`` or ``"server"``.
        nominal: True when the number is a paper's formula rather than an accounted bound.
        notes: free text (sampling scheme, hazards).
        mu: where the mechanism composes to a Gaussian mechanism, its mu-GDP parameter (Dong,
            Roth and Su 2019): its whole trade-off curve is ``beta(alpha) = Phi(Phi^-1(1 - alpha)
            - mu)`` and the epsilon above is exact for it; None otherwise.
    """

    epsilon: float
    delta: float
    accountant: str
    neighbouring: str
    unit: str
    threat_model: str
    nominal: bool = False
    notes: str = ""
    mu: float | None = None

    def __post_init__(self) -> None:
        if not (0.0 < self.delta < 1.0):
            raise PrivacyError(f"delta must lie in (0, 1), got {self.delta}")
        if math.isnan(self.epsilon) or self.epsilon < 0:
            raise PrivacyError(f"epsilon must be a non-negative number, got {self.epsilon}")
        if self.neighbouring not in NEIGHBOURINGS:
            raise PrivacyError(
                f"neighbouring must be one of {NEIGHBOURINGS}, got {self.neighbouring!r}"
            )
        if self.unit not in UNITS:
            raise PrivacyError(f"unit must be one of {UNITS}, got {self.unit!r}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``inf`` stays a float; ``json`` writes ``Infinity``)."""
        return asdict(self)

    def label(self) -> str:
        """A short human label, e.g. ``(eps=1.27, delta=1e-05) secrdp+classic, eavesdropper``."""
        tag = "NOMINAL " if self.nominal else ""
        return (
            f"{tag}(eps={self.epsilon:.4g}, delta={self.delta:.3g}) {self.accountant}, "
            f"{self.threat_model}, {self.unit}-level, {self.neighbouring}"
        )
