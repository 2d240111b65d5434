"""A trusted dealer's correlated noise: any covariance across nodes (Whisper D-SGD's noise).

Whisper D-SGD (Rodio et al., arXiv 2501.14644, Section 4, eq. (8)) chooses the whole per-coordinate
noise covariance ``Sigma`` across the n nodes, not only a variance per node and per edge
(:mod:`privdl.mechanisms.noise_design`). Its optimal ``Sigma`` is dense (correlations many hops
apart), so it cannot come from secrets shared between neighbours: a party that sees every node's
noise (a trusted dealer, or multi-party sampling) has to produce it. privdl simulates that dealer:

    Z = L xi,    L L^T = Sigma (Cholesky),    xi_i ~ N(0, I_d) the stream of node i's noise key,

so node i adds row i of Z; per coordinate ``Cov(Z) = Sigma``. This is for simulation only (one
process holds every node's key); the accountant (:func:`privdl.accounting.design.dealer_step_rdp`)
certifies it against the outside eavesdropper, the threat model of Whisper D-SGD, and labels it as
needing a trusted dealer (docs/noise-design.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from privdl.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where the noise is drawn: the accountants need no torch
    import torch

__all__ = ["DEALER_FORMAT", "DealerCovariance", "dealer_noise", "dealer_threat"]

#: The ``format`` tag of a saved dealer covariance (JSON).
DEALER_FORMAT = "privdl-dealer-covariance/1"


def dealer_threat(threat_model: str) -> str:
    """The threat-model label of a budget whose noise came from the dealer: the dealer, who sees
    every node's noise, must be trusted too."""
    return f"{threat_model}+trusted-dealer"


@dataclass(frozen=True, eq=False)
class DealerCovariance:
    """A positive-definite per-coordinate noise covariance ``covariance`` (n x n) across nodes,
    produced by a trusted dealer (module docstring). ``metadata``: free JSON-ready facts."""

    covariance: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)
    _factor: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            sigma = np.array(self.covariance, dtype=np.float64)
        except (TypeError, ValueError):
            raise ConfigError("dealer covariance: expected an n x n matrix of numbers") from None
        if sigma.ndim != 2 or sigma.shape[0] != sigma.shape[1] or sigma.shape[0] == 0:
            raise ConfigError(f"dealer covariance: expected an n x n matrix, got {sigma.shape}")
        if not np.all(np.isfinite(sigma)):
            raise ConfigError("dealer covariance: entries must be finite")
        scale = float(np.abs(sigma).max())
        if not np.allclose(sigma, sigma.T, rtol=0.0, atol=1e-12 * scale):
            raise ConfigError("dealer covariance: the matrix is not symmetric")
        sigma = 0.5 * (sigma + sigma.T)
        try:
            factor = np.linalg.cholesky(sigma)
        except np.linalg.LinAlgError:
            raise ConfigError("dealer covariance: the matrix is not positive definite") from None
        sigma.setflags(write=False)
        factor.setflags(write=False)
        object.__setattr__(self, "covariance", sigma)
        object.__setattr__(self, "_factor", factor)
        object.__setattr__(self, "metadata", dict(self.metadata))

    @property
    def n(self) -> int:
        """Number of nodes."""
        return int(self.covariance.shape[0])

    @property
    def factor(self) -> np.ndarray:
        """The lower Cholesky factor L of the covariance (read-only)."""
        return self._factor

    def inverse_diagonal(self) -> np.ndarray:
        """diag(Sigma^{-1}) = the squared row norms of L^{-1} (one triangular solve)."""
        from scipy.linalg import solve_triangular

        inv_factor = solve_triangular(self.factor, np.eye(self.n), lower=True)
        return np.einsum("ij,ij->j", inv_factor, inv_factor)

    def scaled(self, factor: float) -> DealerCovariance:
        """The covariance times ``factor`` (the eps-certificate is monotone in it)."""
        return DealerCovariance(self.covariance * factor, self.metadata)

    def check_graph(self, edges: Any, n_nodes: int) -> None:
        """Refuse a covariance for another number of nodes (one line); any graph is fine, the
        dealer's noise does not travel on its edges."""
        if n_nodes != self.n:
            raise ConfigError(
                f"dealer covariance is for {self.n} nodes, not this graph's {n_nodes}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what :meth:`save` writes; floats round-trip exactly)."""
        return {
            "format": DEALER_FORMAT,
            "n": self.n,
            "covariance": self.covariance.tolist(),
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, data: Any) -> DealerCovariance:
        """Validate and build (one-line :class:`ConfigError` on anything wrong)."""
        if not isinstance(data, dict) or data.get("format") != DEALER_FORMAT:
            raise ConfigError(f"dealer covariance: format must be {DEALER_FORMAT!r}")
        unknown = set(data) - {"format", "n", "covariance", "metadata"}
        if unknown:
            raise ConfigError(f"dealer covariance: unknown keys {sorted(unknown)}")
        if "covariance" not in data:
            raise ConfigError("dealer covariance: missing key 'covariance'")
        made = cls(data["covariance"], data.get("metadata") or {})
        if data.get("n", made.n) != made.n:
            raise ConfigError(f"dealer covariance: n = {data['n']} but the matrix is {made.n} x")
        return made

    def save(self, path: str | Path) -> None:
        """Write as JSON."""
        Path(path).write_text(json.dumps(self.to_dict()) + "\n")


def dealer_noise(
    node_keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    dealer: DealerCovariance,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    backend: Any = "auto",
) -> torch.Tensor:
    """Every node's row of ``Z = L xi`` at step ``counter`` (module docstring): ``node_keys``
    are all n nodes' noise keys in node order; returns ``(n, size)`` (``dtype`` None: float32)."""
    import torch

    from privdl.mechanisms.correlated import independent_noise

    if len(node_keys) != dealer.n:
        raise ConfigError(
            f"the dealer's noise needs all {dealer.n} nodes' keys in one process (simulation "
            f"only), got {len(node_keys)}"
        )
    dtype = torch.float32 if dtype is None else dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    unit = independent_noise(
        node_keys, counter, size, sigma=1.0, dtype=work, device=device, backend=backend
    )
    factor = torch.tensor(dealer.factor, dtype=work, device=unit.device)  # a copy
    return (factor @ unit).to(dtype=dtype)
