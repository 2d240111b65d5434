"""Accountants at extreme but valid inputs, against high-precision oracles (mpmath).

Found by an audit that probed every epsilon and calibration at tiny and huge noise, tiny
deltas and huge step counts. Each test failed before its fix:
* the RDP of the Poisson-subsampled Gaussian summed log A_alpha, rounding noise once q/z is
  tiny: negative at some orders, and dp-accounting's conversion then reports epsilon 0;
* (ACC-2) took a difference of square roots: 26% too large a slope at eps = 1e-12, and a
  calibration loop that needed 1e12 iterations to undo it;
* the exact Gaussian conversion stopped its root search at an absolute 1e-12 (2.3x off at
  eps ~ 3e-8, on the unsafe side);
* log(1/delta) overflowed for a subnormal delta.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from privdl.accounting import (
    calibrate_noise_multiplier,
    classic_epsilon,
    classic_rho_for_epsilon,
    dpsgd_budget,
    gaussian_epsilon,
    improved_epsilon,
    step_rdp_for_epsilon,
)
from privdl.accounting.dpsgd import RDP_ORDERS, calibrate_noise_multipliers
from privdl.accounting.nominal import rdp_poisson_subsampled_gaussian
from privdl.errors import PrivacyError

mpmath = pytest.importorskip("mpmath")


def mp_rdp_integer(q: float, z: float, order: int) -> float:
    """log A_a / (a - 1), A_a = E_{k ~ Binom(a, q)} exp((k^2 - k)/(2 z^2)), in 60 digits."""
    with mpmath.workdps(60):
        q_, z_ = mpmath.mpf(q), mpmath.mpf(z)
        total = mpmath.fsum(
            mpmath.binomial(order, k) * q_**k * (1 - q_) ** (order - k)
            * mpmath.exp((k * k - k) / (2 * z_**2))
            for k in range(order + 1)
        )  # fmt: skip
        return float(mpmath.log(total) / (order - 1))


def mp_gaussian_delta(mu: float, eps: float) -> float:
    """Balle and Wang's delta(eps) for mu-GDP, in 80 digits."""
    with mpmath.workdps(80):
        mu_, e = mpmath.mpf(mu), mpmath.mpf(eps)
        return float(
            mpmath.ncdf(-e / mu_ + mu_ / 2) - mpmath.exp(e) * mpmath.ncdf(-e / mu_ - mu_ / 2)
        )


def mp_gaussian_epsilon(mu: float, delta: float, upper: float) -> float:
    """The exact eps at ``delta`` by bisection in 80 digits (``upper`` bounds it from above)."""
    lo, hi = 0.0, upper
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if mp_gaussian_delta(mu, mid) <= delta else (mid, hi)
    return hi


@pytest.mark.parametrize(
    ("q", "z"), [(1e-3, 1e6), (1e-4, 3e5), (1e-5, 1e5), (0.027, 211.0), (0.01, 1.0), (0.3, 5.0)]
)
def test_integer_order_rdp_has_full_relative_precision(q, z):
    orders = np.array([2, 3, 8, 46, 128, 512])
    got = rdp_poisson_subsampled_gaussian(q, z, orders)[0]
    want = [mp_rdp_integer(q, z, int(a)) for a in orders]
    assert np.all(got > 0)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_fractional_orders_stay_upper_bounds_when_the_series_is_noise():
    """At q/z ~ 1e-9 the signed fractional series is rounding noise (dp-accounting's dips below
    zero): every value used is positive and at least the exact RDP of the integer order below
    (RDP is non-decreasing in the order, so the exact value at alpha is at least that)."""
    orders = np.array(RDP_ORDERS)
    curve = rdp_poisson_subsampled_gaussian(1e-3, 1e6, orders)[0]
    assert np.all(curve > 0)
    for a, value in zip(orders, curve, strict=True):
        if a != round(a) and a > 2:
            assert value >= mp_rdp_integer(1e-3, 1e6, math.floor(a)) * (1 - 1e-12)


def test_tiny_sampling_over_noise_is_not_reported_as_zero_epsilon():
    """z = 1e6, q = 1e-3, T = 1e7, delta = 1e-10: dp-accounting alone says 0. The oracle: the
    same orders and conversion on the 60-digit integer-order curve (fractional orders carry
    their ceiling's value there, so the integer orders decide)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    budget = dpsgd_budget(noise_multiplier=1e6, sampling_rate=1e-3, steps=10**7, delta=1e-10)
    ints = [int(a) for a in RDP_ORDERS if a == round(a)]
    curve = np.array([mp_rdp_integer(1e-3, 1e6, a) for a in ints])
    want = compute_epsilon(ints, 10**7 * curve, 1e-10)[0]
    assert budget.epsilon == pytest.approx(want, rel=1e-9)
    assert budget.epsilon > 3e-3


def test_ordinary_dpsgd_numbers_are_dp_accountings():
    """The cross-check changes nothing where dp-accounting's curve is sound."""
    import dp_accounting as dpa
    from dp_accounting import rdp

    acc = rdp.RdpAccountant(orders=RDP_ORDERS)
    acc.compose(
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.1)), 1000)
    )
    got = dpsgd_budget(
        noise_multiplier=1.1, sampling_rate=0.01, steps=1000, delta=1e-5, accountant="rdp"
    )
    assert got.epsilon == acc.get_epsilon(1e-5)


@pytest.mark.parametrize("delta", [1e-300, 1e-10, 0.5])
@pytest.mark.parametrize("eps", [1e-14, 1e-10, 1e-6, 1.0, 1e3])
def test_classic_slope_for_epsilon_matches_60_digits(eps, delta):
    with mpmath.workdps(60):
        log_inv = -mpmath.log(mpmath.mpf(delta))
        want = float((mpmath.sqrt(log_inv + eps) - mpmath.sqrt(log_inv)) ** 2)
    assert classic_rho_for_epsilon(eps, delta) == pytest.approx(want, rel=1e-13, abs=0)
    rho = step_rdp_for_epsilon(eps, steps=10, delta=delta, conversion="classic")  # at once
    assert classic_epsilon(10 * rho, delta) <= eps  # certified
    # the default (exact) conversion: certified too, and never a smaller slope than classic's
    exact = step_rdp_for_epsilon(eps, steps=10, delta=delta)
    assert gaussian_epsilon(10 * exact, delta) <= eps and exact >= rho


@pytest.mark.parametrize("log_rho", [-28, -22, -16, -12, -8, -4, 0, 2])
@pytest.mark.parametrize("delta", [1e-300, 1e-30, 1e-10, 1e-5, 0.3])
def test_gaussian_conversion_never_below_the_exact_epsilon(log_rho, delta):
    """The returned eps satisfies delta(eps) <= delta in 80-digit arithmetic, is never above
    the classic bound, and within 1e-3 of exact wherever delta(eps) is not a difference of two
    tails equal to 9 digits (there float64 cannot certify more than the classic bound)."""
    rho = 10.0**log_rho
    eps = gaussian_epsilon(rho, delta)
    mu = math.sqrt(2 * rho)
    assert eps <= classic_epsilon(rho, delta)
    if eps > 0:
        assert mp_gaussian_delta(mu, eps) <= delta
    if eps > 0:
        exact = mp_gaussian_epsilon(mu, delta, eps)
        if delta > 1e-9 * float(mpmath.ncdf(-mpmath.mpf(exact) / mu + mu / 2)):
            assert eps <= exact * (1 + 1e-3)  # float64 can resolve delta there: tight


def test_subnormal_delta_is_accounted():
    """delta = 1e-310 is in (0, 1): every conversion gives a finite eps (1/delta overflowed)."""
    delta = 1e-310
    log_inv = -math.log(delta)
    assert classic_epsilon(1.0, delta) == pytest.approx(1 + 2 * math.sqrt(log_inv), rel=1e-14)
    assert 0 < gaussian_epsilon(1.0, delta) <= improved_epsilon(1.0, delta)
    assert improved_epsilon(1.0, delta) <= classic_epsilon(1.0, delta)
    assert math.isfinite(step_rdp_for_epsilon(1.0, steps=1, delta=delta))


@pytest.mark.parametrize(("target", "delta"), [(0.1, 1e-300), (1e-6, 1e-10)])
def test_unreachable_target_is_refused_with_the_reason(target, delta):
    """No noise reaches eps below log(1/delta)/(alpha_max - 1) on the order grid: said plainly
    (before the audit: a noise multiplier whose accounted eps was a spurious 0)."""
    with pytest.raises(PrivacyError, match="below what the RDP accountant can certify"):
        calibrate_noise_multiplier(
            target_epsilon=target, sampling_rate=1e-3, steps=10**7, delta=delta, accountant="rdp"
        )
    with pytest.raises(PrivacyError, match="below what the RDP accountant can certify"):
        calibrate_noise_multipliers(
            target_epsilons=[1.0, target], sampling_rates=[1e-3, 1e-3], steps=[100, 10**7],
            delta=delta,
        )  # fmt: skip


def test_a_stated_rate_that_is_not_b_over_n_is_rounded_up_not_down():
    """Fixed-size sampling accounts b of N; a stated rate between two such fractions takes the
    larger one (rounding to the nearest accounted 0.0149 as 0.01 and 0.6 as 0.5: less than
    stated, unsafe)."""
    from privdl.accounting import SubsampledGaussianEvent, account_decor

    def event(q):
        return SubsampledGaussianEvent(
            noise_multiplier=2.0, sampling_rate=q, steps=100, sampling="fixed_size",
            neighbouring="replace_one", dataset_size=100,
        )  # fmt: skip

    assert [event(q).batch_size for q in (0.01, 0.0149, 0.015, 0.02, 1.0)] == [1, 2, 2, 2, 100]

    def eps(q):
        return dpsgd_budget(
            noise_multiplier=2.0, sampling_rate=q, steps=100, delta=1e-5,
            sampling="fixed_size", neighbouring="replace_one", dataset_size=100,
        ).epsilon  # fmt: skip

    assert eps(0.0149) == eps(0.02) > eps(0.01)
    import networkx as nx

    def decor(q):
        return account_decor(
            nx.cycle_graph(8), sigma_cdp=1.0, sigma_cor=1.0, steps=10, delta=1e-5,
            sampling_rate=q, batch_size=1,
        )  # fmt: skip

    assert decor(0.6).sampling["dataset_size"] == 1  # b / N = 1 >= 0.6, not 1/2
    assert decor(0.6).budget.epsilon == decor(1.0).budget.epsilon > decor(0.5).budget.epsilon
