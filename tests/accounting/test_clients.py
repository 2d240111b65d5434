"""Federated clients' calibration and accounting (Robust-HDP Algorithm 1, Eq. 1) against
dp-accounting called directly.

Each client ``i`` is ``T_i = E_i * rounds`` steps of the Poisson-subsampled Gaussian (rate
``q_i = b_i/N_i``, add/remove). Oracles built here, not through privdl's event conversion:
dp-accounting's ``PLDAccountant`` (pessimistic, a certified upper bound; the tightest default is
never below it beyond privdl's round-off allowance), its ``RdpAccountant`` on privdl's orders
(the default is never above it), and its own mechanism calibration
(``dp_accounting.calibrate_dp_mechanism`` with a PLD accountant).
"""

from __future__ import annotations

import logging

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import pld, rdp
from dp_accounting.mechanism_calibration import ExplicitBracketInterval

from privdl.accounting import clients as clients_mod
from privdl.accounting import tightest as tightest_mod
from privdl.accounting.clients import ClientAccountant, client_noise_multipliers
from privdl.accounting.dpsgd import (
    RDP_ORDERS,
    calibrate_noise_multipliers,
    epsilons_from_curves,
    poisson_rdp_curves,
)
from privdl.accounting.events import SubsampledGaussianEvent
from privdl.accounting.rdp_pld import PLD_INTERVAL, PoissonStepCache, event_epsilon
from privdl.errors import PrivacyError

ADD = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
DELTA = 1e-4


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Every test starts from empty calibration and accounting caches (they are counted)."""
    clients_mod._tightest_noise_multiplier.cache_clear()
    clients_mod._tightest_spent.cache_clear()
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    yield
    absl.setLevel(level)
    clients_mod._tightest_noise_multiplier.cache_clear()
    clients_mod._tightest_spent.cache_clear()


def _event(q: float, z: float, steps: int) -> dpa.DpEvent:
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)


def pld_direct(q: float, z: float, steps: int, delta: float = DELTA) -> float:
    """dp-accounting's pessimistic PLD epsilon, called directly."""
    acc = pld.PLDAccountant(neighboring_relation=ADD)
    acc.compose(_event(q, z, steps))
    return float(acc.get_epsilon(delta))


def rdp_direct(q: float, z: float, steps: int, delta: float = DELTA) -> float:
    """dp-accounting's RDP epsilon on privdl's orders, called directly."""
    acc = rdp.RdpAccountant(orders=RDP_ORDERS, neighboring_relation=ADD)
    acc.compose(_event(q, z, steps))
    return float(acc.get_epsilon(delta))


def dpa_pld_calibration(eps: float, q: float, steps: int, z_hi: float) -> float:
    """dp-accounting's own calibration of z against its PLD accountant (bracketed below the
    RDP calibration ``z_hi``: PLD is never looser than RDP, and small z are slow to compose)."""
    return float(
        dpa.calibrate_dp_mechanism(
            lambda: pld.PLDAccountant(neighboring_relation=ADD),
            lambda z: _event(q, z, steps),
            eps,
            DELTA,
            bracket_interval=ExplicitBracketInterval(0.75 * z_hi, z_hi),
            tol=1e-4 * z_hi,
        )
    )


def _clients(n_samples, batch, rounds: int, local_epochs: int = 1):
    counts = np.asarray(n_samples, np.int64)
    b = np.asarray(batch, float)
    local_steps = local_epochs * np.ceil(counts / b).astype(np.int64)
    return dict(batch_sizes=b, num_samples=counts, local_steps=local_steps), rounds


def _calibrate(eps, kw, rounds, calibration="tightest"):
    return client_noise_multipliers(
        np.asarray(eps, float),
        **kw,
        local_epochs=1,
        rounds=rounds,
        delta=DELTA,
        calibration=calibration,
    )


# ------------------------------------------------------------------------------- accounting
def test_tightest_client_epsilon_between_pld_and_rdp_oracles():
    # two settings (the second client repeats the first's q and T from another N and b)
    kw, rounds = _clients([1200, 600, 3000], [64, 32, 64], rounds=5)
    z = np.array([2.0, 2.0, 1.5])
    acc = ClientAccountant(
        noise_multipliers=z, rounds=rounds, delta=DELTA, targets=np.ones(3),
        reported=np.ones(3), **kw,
    )  # fmt: skip
    for participated in (None, [3, 0, 5]):
        budgets = acc.budgets(participated)
        rounds_i = [rounds] * 3 if participated is None else participated
        for b, r, z_i, b_i, n_i, e_i in zip(
            budgets, rounds_i, z, kw["batch_sizes"], kw["num_samples"], kw["local_steps"],
            strict=True,
        ):  # fmt: skip
            if r == 0:
                assert b["accounted"] is None
                continue
            q, steps = b_i / n_i, int(r * e_i)
            got, lower, upper = b["accounted"], pld_direct(q, z_i, steps), rdp_direct(q, z_i, steps)
            assert lower * (1 - 1e-6) <= got["epsilon"] <= upper * (1 + 1e-9)
            assert got["epsilon"] < 0.97 * upper  # the PLD is the number here, not RDP
            assert got["accountant"] == "pld" and "beside rdp" in got["notes"]
            assert (got["threat_model"], got["unit"], got["neighbouring"]) == (
                "server", "example", "add_remove",
            )  # fmt: skip


def test_pld_refused_falls_back_to_rdp_never_lower(monkeypatch):
    """Where the PLD cannot be computed (its round-off guard refuses), the client is accounted
    by RDP, so labelled, and calibration falls back to RDP's z (certified by RDP itself)."""
    real = tightest_mod.event_epsilon

    def refuse_pld(event, *, delta, accountant="rdp", **kw):
        if accountant == "pld":
            raise PrivacyError("the PLD's FFT round-off is not small against delta")
        return real(event, delta=delta, accountant=accountant, **kw)

    monkeypatch.setattr(tightest_mod, "event_epsilon", refuse_pld)
    kw, rounds = _clients([1200], [64], rounds=5)
    acc = ClientAccountant(
        noise_multipliers=np.array([1.3]), rounds=rounds, delta=DELTA, targets=np.ones(1),
        reported=np.ones(1), **kw,
    )  # fmt: skip
    got = acc.budgets()[0]["accounted"]
    q, steps = 64 / 1200, int(5 * kw["local_steps"][0])
    assert got["accountant"] == "rdp" and "PLD failed" in got["notes"]
    assert got["epsilon"] == pytest.approx(rdp_direct(q, 1.3, steps), rel=1e-9)
    z = _calibrate([2.0], kw, rounds)
    assert z[0] == _calibrate([2.0], kw, rounds, calibration="rdp")[0]


def _counting_builds(monkeypatch) -> list[int]:
    """Count dp-accounting's single-step Gaussian PLD builds (the real function still runs)."""
    calls = [0]
    real = pld.privacy_loss_distribution.from_gaussian_mechanism

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(pld.privacy_loss_distribution, "from_gaussian_mechanism", counted)
    return calls


def test_rows_compose_the_kept_single_step_same_numbers(monkeypatch):
    """A metrics row after more rounds self-composes each distinct client's kept single step
    instead of building it again, and gets exactly the numbers (epsilon, label, notes) of the
    tightest accountant with the step built afresh (which dp-accounting's PLDAccountant equals:
    tests/accounting/test_accountant_speed.py), and dp-accounting's PLD called directly."""
    kw, rounds = _clients([300, 600, 300], [3, 6, 6], rounds=6)  # clients 0, 1: same q
    z = np.array([3.0, 3.0, 4.0])  # two distinct (q, z)
    acc = ClientAccountant(
        noise_multipliers=z, rounds=rounds, delta=DELTA, targets=np.ones(3),
        reported=np.ones(3), **kw,
    )  # fmt: skip
    rows = ([1, 1, 1], [2, 1, 0], [4, 3, 3])
    builds = _counting_builds(monkeypatch)
    got = []
    for k, participated in enumerate(rows):
        got.append(acc.budgets(participated))
        assert builds[0] == 2, k  # built by the first row, never again
    # dp-accounting's RDP is not asked: privdl's RDP curve already lies above the PLD here
    assert acc.steps_cache.built == {"pld": 2, "rdp": 0}
    q = kw["batch_sizes"] / kw["num_samples"]
    uncached: dict[tuple, tightest_mod.Accounted] = {}
    for participated, budgets in zip(rows, got, strict=True):
        for i, (b, r) in enumerate(zip(budgets, participated, strict=True)):
            if r == 0:
                assert b["accounted"] is None
                continue
            key = (q[i], z[i], int(r * kw["local_steps"][i]))
            if key not in uncached:
                uncached[key] = tightest_mod.tightest_epsilon(
                    clients_mod._client_event(*key), delta=DELTA, steps_cache=PoissonStepCache()
                )
                assert uncached[key].epsilon == pytest.approx(pld_direct(*key), rel=1e-9)
            ref = uncached[key]
            assert b["accounted"]["epsilon"] == ref.epsilon
            assert b["accounted"]["accountant"] == ref.accountant == "pld"
            assert b["accounted"]["notes"].endswith(ref.notes)
    assert len(uncached) == 6


def test_step_cache_equals_dp_accounting_accountants():
    """:class:`PoissonStepCache` composes a kept step to exactly the epsilon of
    dp-accounting's accountants composing the T-step event afresh: PLD (both relations, two
    discretisations) and RDP, for several T; one step built per mechanism and interval."""
    cache = PoissonStepCache()
    asked = [("add_remove", 3, 1e-3), ("add_remove", 40, 1e-3), ("add_remove", 40, PLD_INTERVAL),
             ("replace_one", 5, 1e-3), ("replace_one", 30, 1e-3)]  # fmt: skip
    for neighbouring, steps, interval in asked:
        ev = SubsampledGaussianEvent(noise_multiplier=3.0, sampling_rate=0.02, steps=steps,
                                     sampling="poisson", neighbouring=neighbouring)  # fmt: skip
        kept = event_epsilon(ev, delta=1e-6, accountant="pld", pld_interval=interval,
                             steps_cache=cache)  # fmt: skip
        assert kept == event_epsilon(ev, delta=1e-6, accountant="pld", pld_interval=interval)
        if neighbouring == "add_remove" and interval != PLD_INTERVAL:
            kept = event_epsilon(ev, delta=1e-6, accountant="rdp", steps_cache=cache)
            assert kept == rdp_direct(0.02, 3.0, steps, delta=1e-6)
    assert cache.built == {"pld": 3, "rdp": 1}


# ------------------------------------------------------------------------------ calibration
def _check_calibration(eps: float, n: int, b: int, rounds: int) -> None:
    kw, rounds = _clients([n], [b], rounds=rounds)
    q, steps = b / n, int(kw["local_steps"][0]) * rounds
    z = float(_calibrate([eps], kw, rounds)[0])
    z_rdp = float(_calibrate([eps], kw, rounds, calibration="rdp")[0])
    # certified: by the accountant that will account it, and by the PLD called directly
    spent = ClientAccountant(
        noise_multipliers=np.array([z]), rounds=rounds, delta=DELTA, targets=np.array([eps]),
        reported=np.array([eps]), **kw,
    ).budgets()[0]["accounted"]  # fmt: skip
    assert spent["epsilon"] <= eps and spent["accountant"] == "pld"
    assert pld_direct(q, z, steps) <= eps * (1 + 1e-6)
    assert rdp_direct(q, z, steps) > eps  # RDP alone would not certify this much noise
    # the smallest: within 1% of dp-accounting's own PLD calibration, and below RDP's
    z_dpa = dpa_pld_calibration(eps, q, steps, z_rdp)
    assert abs(z / z_dpa - 1.0) <= 0.01, (z, z_dpa)
    assert z < z_rdp


def test_tightest_calibration_meets_target_and_matches_dp_accounting():
    _check_calibration(1.0, 600, 32, rounds=5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "eps, n, b, rounds",
    [(2.0, 1200, 64, 5), (5.0, 3000, 64, 5), (1.0, 2400, 64, 25), (2.0, 6000, 64, 25)],
)
def test_tightest_calibration_meets_target_and_matches_dp_accounting_more(eps, n, b, rounds):
    _check_calibration(eps, n, b, rounds)


def test_calibration_cached_per_distinct_setting():
    """100 clients with three distinct (q, T, eps) settings cost three calibrations; their
    accounting three PLD compositions, and asking again none."""
    kinds = [(1200, 64, 1.0), (600, 32, 1.0), (600, 32, 1.5), (3000, 64, 1.0)]  # 2nd = 1st's q, T
    pick = np.arange(100) % len(kinds)
    n = [kinds[k][0] for k in pick]
    b = [kinds[k][1] for k in pick]
    eps = [kinds[k][2] for k in pick]
    kw, rounds = _clients(n, b, rounds=3)
    z = _calibrate(eps, kw, rounds)
    assert clients_mod._tightest_noise_multiplier.cache_info().misses == 3
    for k in range(len(kinds)):
        assert np.all(z[pick == k] == z[pick == k][0])
    assert z[pick == 0][0] == z[pick == 1][0]  # same q, T and eps from another (N, b)
    clients_mod._tightest_spent.cache_clear()
    acc = ClientAccountant(
        noise_multipliers=z, rounds=rounds, delta=DELTA, targets=np.asarray(eps),
        reported=np.asarray(eps), **kw,
    )  # fmt: skip
    first = acc.budgets()
    assert clients_mod._tightest_spent.cache_info().misses == 3
    assert acc.budgets() == first
    assert clients_mod._tightest_spent.cache_info().misses == 3
    assert all(e["accounted"]["epsilon"] <= e["target_epsilon"] for e in first)


# ---------------------------------------------------------------------------- rdp: unchanged
def test_rdp_calibration_and_accounting_are_privdl_0_1s():
    """``calibration="rdp"`` and ``accountant="rdp"`` give exactly the old vectorised path's
    numbers and labels."""
    kw, rounds = _clients([1200, 600, 3000], [64, 32, 64], rounds=4)
    eps = np.array([1.0, 2.0, 0.5])
    z = _calibrate(eps, kw, rounds, calibration="rdp")
    q, steps = kw["batch_sizes"] / kw["num_samples"], kw["local_steps"] * rounds
    old_z = calibrate_noise_multipliers(
        target_epsilons=eps, sampling_rates=q, steps=steps, delta=DELTA
    )
    assert np.array_equal(z, old_z)
    acc = ClientAccountant(
        noise_multipliers=z, rounds=rounds, delta=DELTA, targets=eps, reported=eps,
        calibration="rdp", accountant="rdp", **kw,
    )  # fmt: skip
    participated = np.array([4, 2, 0])
    old_eps = epsilons_from_curves(
        poisson_rdp_curves(q, z), participated * kw["local_steps"], DELTA
    )
    for b, e, r in zip(acc.budgets(participated), old_eps, participated, strict=True):
        if r == 0:
            assert b["accounted"] is None
            continue
        assert b["accounted"]["epsilon"] == float(e) and b["accounted"]["accountant"] == "rdp"
        assert "RDP curve by privdl's series" in b["accounted"]["notes"]
    assert clients_mod._tightest_spent.cache_info().misses == 0  # no PLD asked


def test_unknown_accountant_and_calibration_refused():
    kw, rounds = _clients([600], [32], rounds=1)
    with pytest.raises(PrivacyError, match="accountant must be one of"):
        ClientAccountant(
            noise_multipliers=np.ones(1), rounds=rounds, delta=DELTA, targets=np.ones(1),
            reported=np.ones(1), accountant="pld", **kw,
        )  # fmt: skip
    with pytest.raises(PrivacyError, match="calibration must be one of"):
        _calibrate([1.0], kw, rounds, calibration="pld")
    assert clients_mod._tightest_noise_multiplier.cache_info().misses == 0
