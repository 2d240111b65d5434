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
    assert dpsgd_budget(**kw, accountant="rdp").epsilon == pytest.approx(7.329, abs=1e-3)
    assert dpsgd_budget(**kw, accountant="pld").epsilon == pytest.approx(6.769, abs=1e-3)
    # the default is the tightest certified of the two, labelled with the one that produced it
    default = dpsgd_budget(**kw)
    assert default.epsilon == pytest.approx(6.769, abs=1e-3) and default.accountant == "pld"


def test_abadi_sanity_against_independent_oracle():
    q, z, steps, delta = 256 / 60000, 1.1, 14062, 1e-5
    assert oracle_epsilon(q, z, steps, delta, "classic") == pytest.approx(3.01, abs=0.01)
    ours = dpsgd_budget(
        noise_multiplier=z, sampling_rate=q, steps=steps, delta=delta, accountant="rdp"
    ).epsilon
    oracle = oracle_epsilon(q, z, steps, delta, "cks")
    default = dpsgd_budget(noise_multiplier=z, sampling_rate=q, steps=steps, delta=delta).epsilon
    assert default <= ours  # the tightest certified is never above RDP
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
        assert b.unit == "example" and b.accountant == "pld"


def test_wang_bound_log_space_matches_direct_formula_and_never_overflows():
    """The second-order term log min{4(e^{2r} - 1), 2 e^{2r}} is computed in log space: equal to
    the direct formula where floats hold it, finite (about alpha * r for large r) beyond."""
    orders = np.arange(2, 12)
    g = 0.01
    for r in (1e-8, 1e-3, 0.3, 2.0, 5.0):
        direct = []
        for a in orders:
            terms = 1 + g * g * math.comb(int(a), 2) * min(
                4 * math.expm1(2 * r), 2 * math.exp(2 * r)
            )
            terms += sum(
                2 * g**j * math.comb(int(a), j) * math.exp((j - 1) * j * r)
                for j in range(3, int(a) + 1)
            )
            direct.append(math.log(terms) / (a - 1))
        assert wang_fixed_size_rdp(r, g, orders) == pytest.approx(direct, rel=1e-10)
    big = wang_fixed_size_rdp(1e4, g, orders)  # e^{2e4} is no float
    assert np.isfinite(big).all() and (big <= orders * 1e4).all()


def test_wang_bound_spec_values_and_dp_accounting():
    """DECOR Fig 3 (App. D.1) example level, docs/accounting.md section 6: legacy uncomposed 0.00758; composed (T = 1000) about 19.1."""
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
            noise_multiplier=1,
            sampling_rate=0.1,
            steps=10,
            delta=1e-5,
            neighbouring="replace_one",
            accountant="rdp",
        )
    # the default has PLD for that pair and says RDP was left out
    default = dpsgd_budget(
        noise_multiplier=1, sampling_rate=0.1, steps=10, delta=1e-5, neighbouring="replace_one"
    )
    assert default.accountant == "pld" and "no RDP for Poisson" in default.notes
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
    """Same noise sigma and clip C: z = sigma/C under add/remove, sigma/(2C) under replace-one
    (z is relative to each relation's sensitivity); replacing is removing and adding, so it
    costs more than removing alone."""
    kw = dict(sampling_rate=0.05, steps=100, delta=1e-5, accountant="pld")
    ar = dpsgd_budget(noise_multiplier=2.0, **kw).epsilon
    ro = dpsgd_budget(noise_multiplier=1.0, **kw, neighbouring="replace_one").epsilon
    assert ar < ro


# --------------------------------------------------------------- many clients at once (federated)
@pytest.mark.parametrize(
    "q, z, steps",
    [(0.00786, 0.53, 384), (64 / 2400, 1.1, 7600), (128 / 2400, 3.0, 3800), (0.01, 50.0, 1000)],
)
def test_vectorised_poisson_curves_equal_dp_accounting(q, z, steps):
    """privdl's curve + dp-accounting's conversion against dp-accounting's whole accountant."""
    from privdl.accounting.dpsgd import epsilons_from_curves, poisson_rdp_curves

    ours = epsilons_from_curves(poisson_rdp_curves([q], [z]), [steps], 1e-5)[0]
    lib = dpsgd_budget(
        noise_multiplier=z, sampling_rate=q, steps=steps, delta=1e-5, accountant="rdp"
    ).epsilon
    assert ours == pytest.approx(lib, rel=1e-7)


def test_vectorised_curves_compose_linearly_and_zero_steps_spend_nothing():
    from privdl.accounting.dpsgd import epsilons_from_curves, poisson_rdp_curves

    curves = poisson_rdp_curves([0.02, 0.05], [1.0, 2.0])
    eps = epsilons_from_curves(curves, [0, 300], 1e-5)
    lib = dpsgd_budget(
        noise_multiplier=2.0, sampling_rate=0.05, steps=300, delta=1e-5, accountant="rdp"
    ).epsilon
    assert eps[0] == 0.0 and eps[1] == pytest.approx(lib, rel=1e-7)


def test_vectorised_calibration_against_scalar_bisection():
    """One bisection for all clients gives what the scalar dp-accounting bisection gives, each
    z certified (eps(z) <= target) and tight (a 0.05% smaller z exceeds the target)."""
    from privdl.accounting.dpsgd import calibrate_noise_multipliers

    targets, rates, steps = [0.5, 1.0, 4.0, 8.0], [0.01, 0.02, 0.05, 0.00786], [500, 300, 40, 384]
    zs = calibrate_noise_multipliers(
        target_epsilons=targets, sampling_rates=rates, steps=steps, delta=1e-5
    )
    for z, e, q, t in zip(zs, targets, rates, steps, strict=True):
        scalar = calibrate_noise_multiplier(
            target_epsilon=e, sampling_rate=q, steps=t, delta=1e-5, accountant="rdp"
        )
        assert z == pytest.approx(scalar, rel=2e-4)
        kw = dict(sampling_rate=q, steps=t, delta=1e-5, accountant="rdp")
        spent = dpsgd_budget(noise_multiplier=z, **kw).epsilon
        below = dpsgd_budget(noise_multiplier=z * (1 - 5e-4), **kw).epsilon
        assert spent <= e < below


def test_vectorised_calibration_refuses_bad_input():
    from privdl.accounting.dpsgd import calibrate_noise_multipliers

    with pytest.raises(PrivacyError, match="one positive target"):
        calibrate_noise_multipliers(
            target_epsilons=[1.0, -1.0], sampling_rates=[0.1, 0.1], steps=[10, 10], delta=1e-5
        )


def test_pld_reads_the_replace_one_noise_multiplier_as_rdp_does():
    """privdl's z is relative to the sensitivity of the stated relation. dp-accounting's RDP
    accountant reads it so; its PLD accountant doubles the sensitivity itself under REPLACE_ONE
    (google/differential-privacy#378), which made privdl's PLD replace-one numbers those of twice
    the sensitivity. Oracle: with no sampling the mechanism is exactly mu-GDP, mu = sqrt(T)/z."""
    from privdl.accounting import gaussian_epsilon

    for z, steps in ((2.0, 1), (5.0, 40)):
        exact = gaussian_epsilon(steps / (2 * z**2), 1e-5)
        for relation in ("replace_one", "add_remove"):
            got = dpsgd_budget(
                noise_multiplier=z, sampling_rate=1.0, steps=steps, delta=1e-5,
                accountant="pld", sampling="none", neighbouring=relation,
            ).epsilon  # fmt: skip
            assert got == pytest.approx(exact, rel=1e-4), relation
            rdp_eps = dpsgd_budget(
                noise_multiplier=z, sampling_rate=1.0, steps=steps, delta=1e-5,
                accountant="rdp", sampling="none", neighbouring=relation,
            ).epsilon  # fmt: skip
            assert rdp_eps >= got  # RDP's conversion is never tighter than the exact curve


def test_decor_example_level_pld_at_full_batch_is_the_user_level_gaussian():
    """b = 1, q = 1: one example is the user's whole batch, so example level replace-one is the
    user-level mechanism, whose exact (eps, delta) is the Gaussian conversion."""
    import networkx as nx

    from privdl.accounting import account_decor

    common = dict(sigma_cdp=20.0, sigma_cor=20.0, steps=100, delta=1e-5)
    user = account_decor(nx.cycle_graph(8), conversion="gaussian", **common)
    example = account_decor(
        nx.cycle_graph(8), sampling_rate=1.0, batch_size=1, sampling="poisson",
        neighbouring="replace_one", conversion="pld", **common,
    )  # fmt: skip
    assert example.budget.epsilon == pytest.approx(user.budget.epsilon, rel=1e-4)
