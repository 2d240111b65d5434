"""DECOR's synthetic least-squares task (paper s.6.1 "Least-squares regression";
docs/reproductions-decor.md).

User i = 1..n holds L_i(x) = 1/2 ||A_i x - b_i||^2 with A_i = (i / sqrt(n)) I_d (so A_i^2 =
i^2/n I_d) and b_i ~ N(0, (zeta^2 / i^2) I_d); the reference code uses d = 10 and zeta = 1. The
global optimum of L = (1/n) sum_i L_i is x* = (sum_i A_i^2)^{-1} sum_i A_i b_i.
The reference code draws b without a fixed seed; here the draw is seeded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privdl.errors import DataError


@dataclass(frozen=True)
class LeastSquaresProblem:
    """Per-user data of DECOR's least-squares task (float64).

    a_scale[i] is the scalar s_i with A_i = s_i I_d; b has shape (n, d); x_star has shape (d,).
    """

    a_scale: np.ndarray
    b: np.ndarray
    x_star: np.ndarray
    zeta: float

    @property
    def n(self) -> int:
        """Number of users."""
        return int(self.b.shape[0])

    @property
    def d(self) -> int:
        """Dimension."""
        return int(self.b.shape[1])

    def local_losses(self, x: np.ndarray) -> np.ndarray:
        """L_i(x) for every user; ``x`` is (d,) (shared) or (n, d) (one iterate per user)."""
        r = self.a_scale[:, None] * x - self.b
        return 0.5 * (r**2).sum(axis=-1)

    def local_gradients(self, x: np.ndarray) -> np.ndarray:
        """grad L_i(x) = A_i (A_i x - b_i), shape (n, d)."""
        s = self.a_scale[:, None]
        return s * (s * x - self.b)

    def global_loss(self, x: np.ndarray) -> float:
        """L(x) = (1/n) sum_i L_i(x) at a shared point x."""
        return float(self.local_losses(np.asarray(x)).mean())


def least_squares_problem(
    n: int, *, d: int = 10, zeta: float = 1.0, rng: np.random.Generator
) -> LeastSquaresProblem:
    """Draw DECOR's least-squares data: A_i = (i/sqrt(n)) I_d, b_i ~ N(0, zeta^2/i^2 I_d), i = 1..n.

    Returns the A scales, b and the closed-form optimum x* = (sum A_i^2)^{-1} sum A_i b_i.
    """
    if n < 1 or d < 1:
        raise DataError(f"least squares needs n >= 1 and d >= 1, got n={n}, d={d}")
    if not np.isfinite(zeta) or zeta < 0:
        raise DataError(f"zeta must be finite and >= 0, got {zeta}")
    i = np.arange(1, n + 1, dtype=np.float64)
    a_scale = i / np.sqrt(n)
    b = rng.standard_normal((n, d)) * (zeta / i)[:, None]
    x_star = (a_scale[:, None] * b).sum(axis=0) / (a_scale**2).sum()
    return LeastSquaresProblem(a_scale=a_scale, b=b, x_star=x_star, zeta=float(zeta))
