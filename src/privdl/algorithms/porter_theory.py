"""PORTER's theory constants (Li & Chi, Theorems 2-4 and their proofs) and its output rule.

The theorems state orders (``gamma = O((1 - alpha) rho)``, ``eta = O(1/L)``); their proofs
(Appendices B.4, C, D) fix the constants below. They are offered to check a configuration
against the analysis, not as tuned step sizes: the constants are tiny (Theorem 3's ``eta`` is
``gamma^{8/3} (1-alpha)^{8/3} / (8288 L)``) and the experiments of PORTER §5 tune instead
(``experiments/studies/tune_porter.py``).

Vocabulary (as in the paper): ``alpha = ||W - J||_2`` the mixing rate (Definition 1,
:func:`privdl.algorithms.porter.mixing_rate`); ``rho`` the compressor's contraction,
``E||C(x) - x||^2 <= (1 - rho)||x||^2`` (Definition 3, ``Compressor.contraction``); ``L`` the
smoothness constant; ``Delta = f(x^0) - f*``; ``phi_m = sqrt(d log(1/delta)) / (m eps)``
(:func:`privdl.accounting.nominal.porter_phi`); ``alpha_hat = 1 - gamma (1 - alpha)``, Lemma 1's
bound on ``||I + gamma (W - I) - J||_2``.

Where the statement and the proof disagree the proof is used (Appendices B-D; docs/porter.md,
"Theory constants and the output rule"): Theorem 2's ``eta`` has ``(1 - alpha)^{4/3}`` where the
statement has ``rho^{4/3}``.
"""

from __future__ import annotations

import math

import torch

from privdl.errors import ConfigError

__all__ = [
    "alpha_hat",
    "eta_thm2",
    "eta_thm3",
    "eta_thm4",
    "gamma_theory",
    "nu_thm3",
    "nu_thm4",
    "sample_output_index",
    "thm2_conditions",
    "thm4_batch_size",
]


def _check(alpha: float | None = None, rho: float | None = None, **positive: float) -> None:
    if alpha is not None and not 0.0 <= alpha < 1.0:
        raise ConfigError(f"the mixing rate alpha must be in [0, 1), got {alpha}")
    if rho is not None and not 0.0 < rho <= 1.0:
        raise ConfigError(f"the contraction rho must be in (0, 1], got {rho}")
    for name, v in positive.items():
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{name} must be a positive number, got {v}")


def gamma_theory(alpha: float, rho: float) -> float:
    """``gamma = (1 - alpha) rho / 100`` (Appendix B.4 and C); it satisfies condition (12),
    ``gamma^2 <= rho^2 / (96 (1 - rho))``, for every ``alpha`` and ``rho``."""
    _check(alpha, rho)
    return (1.0 - alpha) * rho / 100.0


def alpha_hat(alpha: float, gamma: float) -> float:
    """``1 - gamma (1 - alpha)``: Lemma 1's contraction of ``I + gamma (W - I)`` around ``J``."""
    _check(alpha, gamma=gamma)
    if gamma > 1:
        raise ConfigError(f"gamma must be in (0, 1], got {gamma}")
    return 1.0 - gamma * (1.0 - alpha)


def eta_thm2(*, alpha: float, gamma: float, phi_m: float, smoothness: float) -> float:
    """Theorem 2 (PORTER-DP, bounded gradients), Appendix B.4:
    ``eta = gamma^{4/3} (1 - alpha)^{4/3} phi_m / (32 L)`` (the proof's exponent base)."""
    _check(alpha, gamma=gamma, phi_m=phi_m, smoothness=smoothness)
    return (gamma * (1.0 - alpha)) ** (4.0 / 3.0) * phi_m / (32.0 * smoothness)


def eta_thm3(*, alpha: float, gamma: float, smoothness: float) -> float:
    """Theorem 3 (PORTER-DP with clipping), Appendix C:
    ``eta = gamma^{8/3} (1 - alpha)^{8/3} / (8288 L)`` (not a plain ``O(1/L)``)."""
    _check(alpha, gamma=gamma, smoothness=smoothness)
    return (gamma * (1.0 - alpha)) ** (8.0 / 3.0) / (8288.0 * smoothness)


def nu_thm3(
    *, alpha: float, gamma: float, smoothness: float, initial_gap: float, phi_m: float
) -> float:
    """Theorem 3's target ``nu = 1784 sqrt(L Delta phi_m) / (gamma (1 - alpha))^{4/3}``; the proof
    clips at ``tau = nu`` and needs ``nu >= 24 sigma_g``."""
    _check(alpha, gamma=gamma, smoothness=smoothness, initial_gap=initial_gap, phi_m=phi_m)
    return 1784.0 * math.sqrt(smoothness * initial_gap * phi_m) / (gamma * (1 - alpha)) ** (4 / 3)


def eta_thm4(*, smoothness: float) -> float:
    """Theorem 4 (PORTER-GC), Appendix D: ``eta = sqrt(8/2072) / L`` (about ``0.0621/L``). The
    proof's own condition (25) needs ``(1 - alpha_hat)^{4/3} >= 1/2``, which this ``eta``
    breaks for any useful ``gamma`` (Appendix D): the constant is illustrative."""
    _check(smoothness=smoothness)
    return math.sqrt(8.0 / 2072.0) / smoothness


def nu_thm4(*, alpha_hat: float, smoothness: float, initial_gap: float, steps: int) -> float:
    """Theorem 4's accuracy ``nu = sqrt(L Delta / ((1 - alpha_hat)^{8/3} T))``; ``tau = nu``."""
    _check(smoothness=smoothness, initial_gap=initial_gap, steps=steps)
    if not 0.0 <= alpha_hat < 1.0:
        raise ConfigError(f"alpha_hat must be in [0, 1), got {alpha_hat}")
    return math.sqrt(smoothness * initial_gap / ((1.0 - alpha_hat) ** (8.0 / 3.0) * steps))


def thm4_batch_size(*, sigma_g: float, nu: float) -> int:
    """Theorem 4's minibatch ``b = (24 sigma_g / nu)^2``, rounded up (at least 1)."""
    _check(nu=nu)
    if not (math.isfinite(sigma_g) and sigma_g >= 0):
        raise ConfigError(f"sigma_g must be >= 0, got {sigma_g}")
    return max(1, math.ceil((24.0 * sigma_g / nu) ** 2))


def thm2_conditions(
    *, alpha: float, rho: float, gamma: float, eta: float, smoothness: float
) -> dict[str, bool]:
    """The step-size conditions Theorem 2's proof checks (Appendix B.4):

    * (12) ``gamma^2 <= rho^2 / (96 (1 - rho))``;
    * (16) ``(1 - a) rho / 4 - 16 (1 - rho) gamma^2 / (1 - a) * 24 gamma^2 / rho
      >= (1 - a) rho / 8`` with ``a = alpha_hat``;
    * (25) ``eta L <= (1/8) (1 - alpha_hat)^{4/3}``.
    """
    _check(alpha, rho, gamma=gamma, eta=eta, smoothness=smoothness)
    a = alpha_hat(alpha, gamma)
    c12 = rho == 1.0 or gamma**2 <= rho**2 / (96.0 * (1.0 - rho))
    lhs16 = (1 - a) * rho / 4 - 16 * (1 - rho) * gamma**2 / (1 - a) * 24 * gamma**2 / rho
    return {
        "(12)": bool(c12),
        "(16)": bool(lhs16 >= (1 - a) * rho / 8),
        "(25)": bool(eta * smoothness <= (1 - a) ** (4 / 3) / 8),
    }


def sample_output_index(*, n: int, steps: int, generator: torch.Generator) -> tuple[int, int]:
    """The theory's output ``x_out ~ Uniform{x_i^(t) : i in [n], t in [T]}`` (Algorithm 1's last
    line) as an index ``(i, t)``, with ``t`` in ``1..T``. Draw it before training and keep agent
    ``i``'s model after step ``t``: no iterate history is stored. The plots follow Section 5
    and use the average ``x_bar^(t)`` instead."""
    if n < 1 or steps < 1:
        raise ConfigError(f"need n >= 1 and steps >= 1, got n={n}, steps={steps}")
    k = int(torch.randint(0, n * steps, (1,), generator=generator))
    return k % n, k // n + 1
