"""DP-SGD accounting: golden values, an independent integer-order RDP oracle, calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import gammaln, logsumexp

from privdl.accounting import (
    SubsampledGaussianEvent,
    calibrate_nodes,
    calibrate_noise_multiplier,
    dpsgd_budget,
    event_epsilon,
    node_budgets,
    wang_fixed_size_rdp,
)
from privdl.accounting.dpsgd import classic_from_curve
from privdl.errors import PrivacyError


def oracle_rdp(q: float, z: float, order: int) -> float:
    """Poisson-subsampled Gaussian RDP at integer order (Mironov et al. 2019, binomial sum)."""
    k = np.arange(order + 1)
    log_binom = gammaln(order + 1) - gammaln(k + 1) - gammaln(order - k + 1)
    terms = log_binom + (order - k) * np.log1p(-q) + k * np.log(q) + (k * k - k) / (2 * z * z)
    return float(logsumexp(terms) / (order - 1))


def oracle_epsilon(q, z, steps, delta, conversion, orders=range(2, 257)):
    best = math.inf
    for a in orders:
        r = steps * oracle_rdp(q, z, a)
        if conversion == "classic":
            e = r + math.log(1 / delta) / (a - 1)
        else:  # Canonne-Kamath-Steinke
            e = r + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
        best = min(best, e)
    return best


def test_golden_values():
    kw = dict(noise_multiplier=1.5, sampling_rate=0.04, steps=2250, delta=1e-5)
    assert dpsgd_budget(**kw).epsilon == pytest.approx(7.329, abs=1e-3)
    assert dpsgd_budget(**kw, accountant="pld").epsilon == pytest.approx(6.769, abs=1e-3)


def test_abadi_sanity_against_independent_oracle():
    q, z, steps, delta = 256 / 60000, 1.1, 14062, 1e-5
    assert oracle_epsilon(q, z, steps, delta, "classic") == pytest.approx(3.01, abs=0.01)
    ours = dpsgd_budget(noise_multiplier=z, sampling_rate=q, steps=steps, delta=delta).epsilon
    oracle = oracle_epsilon(q, z, steps, delta, "cks")
    # ours also uses fractional orders, so it can only be lower, and not by much
    assert oracle * 0.97 <= ours <= oracle + 1e-9


def test_calibration_round_trip_is_conservative():
    kw = dict(sampling_rate=0.01, steps=100, delta=1e-5)
    z = calibrate_noise_multiplier(target_epsilon=2.0, rtol=1e-3, **kw)
    assert dpsgd_budget(noise_multiplier=z, **kw).epsilon <= 2.0
    assert dpsgd_budget(noise_multiplier=z * (1 - 3e-3), **kw).epsilon > 2.0


def test_heterogeneous_nodes():
    eps = [0.5, 4.0]
    zs = calibrate_nodes(epsilons=eps, deltas=1e-5, sampling_rates=0.02, steps=50, rtol=1e-3)
    assert zs[0] > zs[1]
    budgets = node_budgets(noise_multipliers=zs, sampling_rates=0.02, steps=50, deltas=1e-5)
    for b, target in zip(budgets, eps, strict=True):
        assert b.epsilon <= target
        assert b.epsilon == pytest.approx(target, rel=1e-2)
        assert b.unit == "example" and b.accountant == "rdp"


def test_wang_bound_spec_values_and_dp_accounting():
    """Spec s.8.3 example level: legacy uncomposed 0.00758; composed (T = 1000) about 19.1."""
    import networkx as nx

    from privdl.accounting import decor_step_rdp

    s = decor_step_rdp(nx.cycle_graph(16), sigma_cdp=0.005, sigma_cor=0.1, clip=1 / 64).step_rdp
    orders = np.arange(2, 257)
    curve = wang_fixed_size_rdp(s, 64 / 3750, orders)
    assert curve.min() == pytest.approx(0.00758, abs=1e-5)
    composed = classic_from_curve(orders, 1000 * curve, 1e-5)
    assert composed == pytest.approx(19.1, abs=0.05)
    lib = event_epsilon(
        SubsampledGaussianEvent(
            noise_multiplier=1 / math.sqrt(2 * s),
            sampling_rate=64 / 3750,
            steps=1000,
            sampling="fixed_size",
            neighbouring="replace_one",
            dataset_size=3750,
        ),
        delta=1e-5,
    )
    assert 0.8 * composed <= lib <= composed  # dp-accounting's tighter variant of the same bound


def test_unsupported_pairs_and_bad_input():
    with pytest.raises(PrivacyError, match="does not support"):
        dpsgd_budget(
            noise_multiplier=1, sampling_rate=0.1, steps=10, delta=1e-5, neighbouring="replace_one"
        )
    with pytest.raises(PrivacyError, match="does not support"):
        dpsgd_budget(
            noise_multiplier=1,
            sampling_rate=0.1,
            steps=10,
            delta=1e-5,
            sampling="fixed_size",
            dataset_size=100,
            accountant="pld",
            neighbouring="replace_one",
        )
    with pytest.raises(PrivacyError):
        dpsgd_budget(noise_multiplier=0, sampling_rate=0.1, steps=10, delta=1e-5)
    with pytest.raises(PrivacyError):
        dpsgd_budget(noise_multiplier=1, sampling_rate=1.5, steps=10, delta=1e-5)
    with pytest.raises(PrivacyError, match="delta"):
        dpsgd_budget(noise_multiplier=1, sampling_rate=0.1, steps=10, delta=1.0)


def test_poisson_replace_one_pld_is_weaker_than_add_remove():
    kw = dict(noise_multiplier=2.0, sampling_rate=0.05, steps=100, delta=1e-5, accountant="pld")
    ar = dpsgd_budget(**kw).epsilon
    ro = dpsgd_budget(**kw, neighbouring="replace_one").epsilon
    assert ro > ar
