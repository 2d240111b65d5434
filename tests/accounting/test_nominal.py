"""The papers' nominal formulas against worked numbers from their closed forms, and their accounted epsilon."""

from __future__ import annotations

import math

import pytest

from privdl.accounting import (
    porter_phi,
    porter_plan,
    porter_sigma,
    privsgp_optimal_steps,
    privsgp_plan,
    privsgp_sigma,
    privsgp_utility,
    robust_hdp_epsilon,
    robust_hdp_noise_multiplier,
    robust_hdp_plan,
)
from privdl.accounting.nominal import privsgp_vr_sensitivity
from privdl.errors import PrivacyError


@pytest.mark.parametrize(("k", "sigma"), [(500, 0.24284), (3120, 0.60651), (12500, 1.21393)])
def test_privsgp_sigma_t13(k, sigma):
    got = privsgp_sigma(gradient_bound=10, steps=k, local_samples=3125, epsilon=3, delta=1e-5)
    assert got == pytest.approx(sigma, rel=3e-4)  # references rounded inconsistently (~2e-4)


def test_privsgp_optimal_k_t14_t15():
    toy = dict(A=100, local_samples=100, n=4, smoothness=1, dim=10, gradient_bound=1)
    k, u = privsgp_optimal_steps(**toy, epsilons=[1] * 4, deltas=[math.exp(-1)] * 4)
    assert k == pytest.approx(462.963, abs=1e-3)
    assert u == pytest.approx(4.64758, abs=1e-5)
    util = lambda kk: privsgp_utility(kk, **toy, epsilons=[1] * 4, deltas=[math.exp(-1)] * 4)  # noqa: E731
    assert util(k) == pytest.approx(u, rel=1e-12)
    assert util(0.9 * k) > u < util(1.1 * k)
    sig = privsgp_sigma(gradient_bound=1, steps=k, local_samples=100, epsilon=1, delta=math.exp(-1))
    assert sig == pytest.approx(0.645497, abs=1e-6)
    eps, dels = [0.5, 1, 2, 4], [1e-5, 1e-5, 1e-3, 1e-3]
    k, u = privsgp_optimal_steps(**toy, epsilons=eps, deltas=dels)
    assert (k, u) == (pytest.approx(31.0072, abs=1e-4), pytest.approx(17.9584, abs=1e-4))
    mean_sq = (
        sum(
            privsgp_sigma(gradient_bound=1, steps=k, local_samples=100, epsilon=e, delta=d) ** 2
            for e, d in zip(eps, dels, strict=True)
        )
        / 4
    )
    assert mean_sq == pytest.approx(100 / 240, rel=1e-10)  # balance identity A/(24 L d)


def test_privsgp_cifar_t16_and_accounted_hazard():
    cifar = dict(
        A=342_000_036.4,
        local_samples=3125,
        n=16,
        smoothness=25,
        dim=11_173_962,
        gradient_bound=10,
        epsilons=[3] * 16,
        deltas=[1e-5] * 16,
    )
    k, u = privsgp_optimal_steps(**cifar, c2=0.3724035)
    assert k == pytest.approx(3120.0, abs=0.1)
    assert u == pytest.approx(3.0614e6, rel=1e-4)
    plan = privsgp_plan(
        gradient_bound=10, steps=3120, local_samples=3125, epsilon=3, delta=1e-5, c2=0.3724035
    )
    assert plan.values["sigma"] == pytest.approx(0.225857, abs=1e-6)
    assert plan.nominal.nominal and plan.nominal.epsilon == 3
    assert plan.accounted.epsilon > 100  # sigma ~70x too small (docs/privsgp-vr.md)
    # certified: K Gaussian steps at sensitivity (4 - 2/J) G, no amplification: exactly
    # mu-GDP, mu = sqrt(K) sens / sigma, converted exactly (Balle-Wang delta(eps) = delta)
    from scipy.stats import norm

    sens = (4 - 2 / 3125) * 10
    mu = math.sqrt(3120) * sens / plan.values["sigma"]
    eps = plan.accounted.epsilon
    assert plan.accounted.accountant == "gaussian" and plan.accounted.mu == pytest.approx(mu)

    def bw_delta(e):
        return norm.cdf(-e / mu + mu / 2) - math.exp(e + norm.logcdf(-e / mu - mu / 2))

    assert bw_delta(eps) <= 1e-5 < bw_delta(eps * (1 - 1e-6))
    classic = mu**2 / 2 + 2 * math.sqrt(mu**2 / 2 * math.log(1e5))  # Lemma 11, closed form
    assert eps < classic
    # the paper-style Poisson number is smaller: an approximation, kept for comparison
    assert plan.values["epsilon_poisson_approximation"] < plan.accounted.epsilon


def test_porter_formulas():
    assert porter_sigma(
        tau=1, steps=1000, delta=1e-3, local_samples=3256, epsilon=1e-2
    ) == pytest.approx(2.5526, abs=1e-4)
    assert porter_sigma(
        tau=1, steps=1000, delta=1e-3, local_samples=3256, epsilon=1e-1
    ) == pytest.approx(0.25526, abs=1e-5)
    assert porter_phi(dim=124, local_samples=3256, epsilon=1e-2, delta=1e-3) == pytest.approx(
        0.8989, abs=1e-4
    )
    # T = phi_m^-2 gives sigma_p = tau / sqrt(d)
    phi = porter_phi(dim=124, local_samples=3256, epsilon=0.1, delta=1e-3)
    sig = porter_sigma(tau=2.0, steps=phi**-2, delta=1e-3, local_samples=3256, epsilon=0.1)
    assert sig == pytest.approx(2.0 / math.sqrt(124), rel=1e-12)


def test_porter_accounted_vs_nominal():
    """PORTER Theorem 1 on a9a (paper Section 5.1; docs/porter.md): eps 0.1, T = 1000 gives sigma 0.255 but an accounted eps >> 0.1.

    An integer-order accountant (docs/porter.md) reports ~369; dp-accounting's fractional orders near 1
    give ~15. Either way the nominal 0.1 is off by two orders of magnitude.
    """
    plan = porter_plan(tau=1, steps=1000, delta=1e-3, local_samples=3256, epsilon=0.1)
    assert plan.values["epsilon_add_remove_poisson"] > 100 * 0.1
    assert plan.accounted.epsilon > plan.values["epsilon_add_remove_poisson"]
    assert any("T/m^2" in w for w in plan.warnings)
    plan = porter_plan(tau=1, steps=10000, delta=1e-3, local_samples=3256, epsilon=0.01)
    # reference value: about 0.014 under add/remove (classic conversion); dp-accounting's is tighter
    assert plan.values["epsilon_add_remove_poisson"] < 0.014 * 1.05


def test_porter_plan_accounts_as_the_run_does():
    """Definition 4 is replace-one: the plan's accounted epsilon is the one ``privdl run
    porter-dp`` labels a b = 1 run with (it used add/remove with sensitivity tau, 4x lower)."""
    from privdl.accounting.dpsgd import event_epsilon
    from privdl.accounting.events import DecorStepEvent

    tau, m, t = 1.0, 3256, 1000
    plan = porter_plan(tau=tau, steps=t, delta=1e-3, local_samples=m, epsilon=0.01)
    sigma = plan.values["sigma_p"]
    run = DecorStepEvent(
        step_rdp=(2 * tau) ** 2 / (2 * sigma**2),  # replace-one sensitivity 2 tau, b = 1
        steps=t, threat_model="ldp", sampling_rate=1 / m, sampling="fixed_size", dataset_size=m,
    )  # fmt: skip
    expected = event_epsilon(run.as_gaussian("replace_one"), delta=1e-3, accountant="rdp")
    assert plan.accounted.epsilon == pytest.approx(expected, rel=1e-9)
    assert plan.accounted.neighbouring == "replace_one" and plan.accounted.threat_model == "ldp"
    assert plan.accounted.epsilon > 3 * plan.values["epsilon_add_remove_poisson"]


@pytest.mark.slow  # 110 s of dp-accounting RDP over 4000 orders (the oracle)
def test_porter_plan_is_capped_by_unsampled_steps_as_the_run_is():
    """At Theorem 1's noise for a nominal 0.1 (a9a, T = 100) one b = 1 of m step costs more by
    dp-accounting's without-replacement bound than T unsampled steps do; the run records the
    smaller (valid: a sampled step is a mixture of unsampled ones), and so must the plan.
    Oracles: dp-accounting called directly and the classic conversion in closed form."""
    import dp_accounting as dpa

    tau, m, t, delta = 1.0, 3256, 100, 1e-3
    plan = porter_plan(tau=tau, steps=t, delta=delta, local_samples=m, epsilon=0.1)
    z_r = plan.values["sigma_p"] / (2 * tau)
    acc = dpa.rdp.RdpAccountant(
        orders=[1 + x / 4 for x in range(1, 40)] + list(range(11, 4097)),
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE,
    )
    acc.compose(dpa.SampledWithoutReplacementDpEvent(m, 1, dpa.GaussianDpEvent(z_r)), t)
    rho = t / (2 * z_r**2)
    unsampled = rho + 2 * math.sqrt(rho * math.log(1 / delta))  # classic, closed form
    assert unsampled < acc.get_epsilon(delta)  # the cap binds here
    # the cap is the exact epsilon of T unsampled steps (mu-GDP, mu = sqrt(T)/z_r): below the
    # classic conversion, and delta(eps) of Balle and Wang meets delta there and not below
    from scipy.stats import norm

    mu = math.sqrt(t) / z_r
    eps = plan.accounted.epsilon
    assert eps < unsampled

    def bw_delta(e):
        return norm.cdf(-e / mu + mu / 2) - math.exp(e + norm.logcdf(-e / mu - mu / 2))

    assert bw_delta(eps) <= delta < bw_delta(eps * (1 - 1e-6))
    assert "capped by the unsampled" in plan.accounted.notes


def test_robust_hdp_z_o6_o7():
    z16 = robust_hdp_noise_multiplier(
        epsilon=1, delta=1e-4, batch_size=16, dataset_size=2400, round_to=None
    )
    assert z16 == pytest.approx(5.147, abs=1e-3)
    assert robust_hdp_epsilon(z16, batch_size=16, dataset_size=2400, delta=1e-4) == pytest.approx(
        1.0, abs=1e-6
    )
    assert (
        robust_hdp_noise_multiplier(epsilon=0.15, delta=1e-4, batch_size=64, dataset_size=2400)
        == 211.79
    )


def test_robust_hdp_plan_labels():
    plan = robust_hdp_plan(epsilon=2.81, delta=1e-4, batch_size=32, dataset_size=2400)
    assert plan.values["noise_multiplier"] == 2.78
    assert plan.nominal.nominal and not plan.accounted.nominal
    # Opacus steps ceil(N/b) per epoch = N/b here; the tighter accountant certifies less
    assert plan.accounted.epsilon < plan.values["epsilon_code_orders"]


def test_bad_inputs():
    with pytest.raises(PrivacyError):
        privsgp_sigma(gradient_bound=1, steps=10, local_samples=10, epsilon=0, delta=1e-5)
    with pytest.raises(PrivacyError, match="delta"):
        porter_sigma(tau=1, steps=10, delta=1.5, local_samples=10, epsilon=1)


@pytest.mark.parametrize("entries, block", [(1, 1), (3, 2), (10, 1), (5, 4)])
def test_privsgp_vr_sensitivity_is_attained_and_never_exceeded(entries, block):
    """Oracle: eq. (6)'s g = h - T[xi] + mean_j T[j] computed on two neighbouring datasets (one
    example of block b replaced), per-sample gradients clipped at C. Random configurations stay
    within the bound, and the adversarial one (the example's gradient flips between the stored
    and the current iterate) reaches it: the bound is tight."""
    import numpy as np

    rng = np.random.default_rng(0)
    clip, dim, b = 1.5, 3, 0
    bound = privsgp_vr_sensitivity(clip, entries=entries, block_size=block)

    def g(table: np.ndarray, h: np.ndarray, xi: int) -> np.ndarray:
        return h - table[xi] + table.mean(axis=0)

    def clipped(v: np.ndarray) -> np.ndarray:
        return v * np.minimum(1.0, clip / np.linalg.norm(v, axis=-1, keepdims=True))

    worst = 0.0
    for _ in range(300):
        # per-sample clipped gradients: at the stored iterates (the table) and at the current one
        stored = clipped(rng.normal(size=(entries, block, dim)) * 3)
        current = clipped(rng.normal(size=(entries, block, dim)) * 3)
        stored2, current2 = stored.copy(), current.copy()  # neighbour: example 0 of block b
        stored2[b, 0] = clipped(rng.normal(size=dim) * 3)
        current2[b, 0] = clipped(rng.normal(size=dim) * 3)
        for xi in range(entries):
            d = g(stored.mean(1), current[xi].mean(0), xi) - g(
                stored2.mean(1), current2[xi].mean(0), xi
            )
            worst = max(worst, float(np.linalg.norm(d)))
    assert worst <= bound * (1 + 1e-12)

    u = np.eye(dim)[0] * clip
    stored, current = np.zeros((entries, block, dim)), np.zeros((entries, block, dim))
    stored2, current2 = stored.copy(), current.copy()
    stored[b, 0], current[b, 0] = -u, u
    stored2[b, 0], current2[b, 0] = u, -u
    d = g(stored.mean(1), current[b].mean(0), b) - g(stored2.mean(1), current2[b].mean(0), b)
    assert math.isclose(float(np.linalg.norm(d)), bound, rel_tol=1e-12)
    # the (4 + 2/J) C/B the library used until session 16 is not reached (for J > 1)
    assert entries == 1 or float(np.linalg.norm(d)) < (4 + 2 / entries) * clip / block


@pytest.mark.parametrize(("q", "z"), [(0.1, 0.5), (0.05, 0.4), (0.01, 1.1), (0.2, 2.0)])
def test_fractional_orders_whose_series_does_not_converge_are_dropped(q, z):
    """A fractional order whose two-sided series has not converged is inf (the order is dropped,
    as dp-accounting does), never a truncated (too small) sum; finite ones equal dp-accounting's."""
    import warnings

    import numpy as np
    from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp

    from privdl.accounting.nominal import rdp_poisson_subsampled_gaussian

    orders = [1.25, 1.5, 1.75, 2.5, 3.5, 10.5]
    ours = rdp_poisson_subsampled_gaussian(q, z, orders)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib = np.array(
            [dpa_rdp._compute_rdp_poisson_subsampled_gaussian(q, z, [o])[0] for o in orders]
        )
    assert np.all(np.isinf(ours[np.isinf(lib)]))  # never finite where the series diverges
    finite = np.isfinite(ours)
    assert finite.any() and ours[finite] == pytest.approx(lib[finite], rel=1e-6)
    if (q, z) == (0.1, 0.5):  # a truncated sum would give 0.150 here
        assert math.isinf(ours[1])


def test_privsgp_vr_accounted_sigma_never_certifies_above_the_target():
    """Over a grid of (eps, K, J, C, B), the sigma the run calibrates to certifies at most the
    target epsilon in the run's own records (privsgp_vr_budget): the calibration rounds toward
    more noise (without its safety factor a few grid points land ulps above)."""
    from privdl.accounting.nominal import privsgp_accounted_sigma, privsgp_vr_budget

    worst = 0.0
    for eps in (0.1, 0.2, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 10.0, 30.0):
        for steps in (1, 10, 17, 100, 500, 1000, 3120, 6000):
            for entries, block in ((2, 1), (10, 1), (50, 1), (3125, 1), (600, 16), (1200, 16)):
                for clip in (0.1, 1.0, 3.0, 7.0, 10.0):
                    kw = dict(clip=clip, steps=steps, delta=1e-5, entries=entries)
                    sigma = privsgp_accounted_sigma(epsilon=eps, block_size=block, **kw)
                    got = privsgp_vr_budget(sigma=sigma, block_size=block, **kw).epsilon
                    assert got <= eps, (eps, steps, entries, block, clip)
                    worst = max(worst, got / eps)
    assert worst > 1 - 1e-6  # and tight: the calibration is not merely conservative


def test_plans_side_figures_carry_their_labels():
    """Every epsilon in a plan's values is also given as a labelled budget: relation, unit,
    threat model, and NOMINAL where no accountant certifies it for the mechanism."""
    from privdl.accounting import dpsgd_budget

    plan = privsgp_plan(gradient_bound=1.0, steps=100, local_samples=500, epsilon=1.0, delta=1e-5)
    sgp = plan.comparisons["poisson_approximation"]
    z = plan.values["sigma"] / 3.0  # sensitivity 3G, G = 1
    oracle = dpsgd_budget(noise_multiplier=z, sampling_rate=1 / 500, steps=100, delta=1e-5)
    assert sgp.epsilon == pytest.approx(oracle.epsilon, rel=1e-12)
    assert sgp.nominal and (sgp.neighbouring, sgp.unit, sgp.threat_model) == (
        "add_remove", "example", "ldp",
    )  # fmt: skip
    por = porter_plan(tau=1, steps=1000, delta=1e-3, local_samples=3256, epsilon=0.1)
    side = por.comparisons["add_remove_poisson"]
    assert side.epsilon == por.values["epsilon_add_remove_poisson"] and not side.nominal
    assert (side.neighbouring, side.threat_model) == ("add_remove", "ldp")
    assert "not its guarantee" in side.notes
    rh = robust_hdp_plan(epsilon=2.81, delta=1e-4, batch_size=32, dataset_size=2400)
    code = rh.comparisons["code_orders"]
    assert code.epsilon == rh.values["epsilon_code_orders"] and code.nominal
    assert code.accountant == "nominal:robust-hdp-code" and code.threat_model == "server"
    assert set(por.to_dict()["comparisons"]["add_remove_poisson"]) >= {"epsilon", "threat_model"}
