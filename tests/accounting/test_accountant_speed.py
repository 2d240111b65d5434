"""The accountant's fast paths give dp-accounting's numbers (issue 37, item 5).

* ``dpsgd_budget``'s default equals dp-accounting's PLD accountant called directly, bit for bit,
  also where it no longer asks dp-accounting's RDP accountant (which is then checked to be the
  larger, as the skip claims), and where it is handed a kept step;
* where RDP is the tightest, it equals dp-accounting's RDP accountant called directly;
* privdl's bucketed evaluation of the integer-order RDP series equals the dense evaluation on the
  full ``orders x (max order + 1)`` grid to the last bit;
* DECOR's SecRDP step on graphs the cyclic shift maps onto itself (item 4): the closed form for
  the eavesdropper and the colluding sets through vertex 0 equal the full computation, and the
  closed form equals a dense inverse.
"""

from __future__ import annotations

import logging
import warnings

import dp_accounting as dpa
import networkx as nx
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy.special import gammaln, logsumexp

from privdl.accounting import poisson_rdp
from privdl.accounting._graph import edge_array, shift_invariant
from privdl.accounting.dpsgd import dpsgd_budget
from privdl.accounting.events import SubsampledGaussianEvent
from privdl.accounting.rdp_pld import RDP_ORDERS, PoissonStepCache, pld_round_off_mass
from privdl.accounting.secrdp import circulant_inverse_diagonal, decor_step_rdp
from privdl.accounting.tightest import SHARED_STEPS, tightest_epsilon


@pytest.fixture(autouse=True)
def _quiet_and_fresh():
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    SHARED_STEPS.clear()
    yield
    absl.setLevel(level)
    SHARED_STEPS.clear()


def _event(q: float, z: float, steps: int) -> dpa.DpEvent:
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)


def pld_direct(q: float, z: float, steps: int, delta: float) -> float:
    """dp-accounting's PLDAccountant on an event built here, read at delta less 4x its FFT
    round-off mass (what privdl certifies; 0 in the settings below but for the last bits)."""
    acc = pld_lib.PLDAccountant()
    acc.compose(_event(q, z, steps))
    return float(acc.get_epsilon(delta - 4.0 * pld_round_off_mass(acc)))


def rdp_direct(q: float, z: float, steps: int, delta: float) -> float:
    """dp-accounting's RdpAccountant on privdl's orders, on an event built here."""
    acc = rdp_lib.RdpAccountant(orders=RDP_ORDERS)
    acc.compose(_event(q, z, steps))
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize(
    ("z", "q", "steps", "delta"),
    [(2.0, 0.001, 1000, 1e-5), (5.0, 0.02, 100, 1e-5), (3.0, 0.01, 200, 1e-6)],
)
def test_default_is_dp_accountings_pld_and_skips_rdp_only_where_it_is_larger(z, q, steps, delta):
    cache = PoissonStepCache()
    event = SubsampledGaussianEvent(z, q, steps, "poisson", "add_remove")
    got = tightest_epsilon(event, delta=delta, steps_cache=cache)
    pld = pld_direct(q, z, steps, delta)
    rdp = rdp_direct(q, z, steps, delta)
    assert got.accountant == "pld" and got.epsilon == pld
    assert rdp > pld  # the RDP accountant was not the tightest
    assert cache.built == {"pld": 1, "rdp": 0}  # ... and dp-accounting's was not asked
    # the RDP figure reported beside it is privdl's curve: dp-accounting's to ~1e-9
    assert got.candidates["rdp"] == pytest.approx(rdp, rel=1e-7)
    budget = dpsgd_budget(noise_multiplier=z, sampling_rate=q, steps=steps, delta=delta)
    assert (budget.epsilon, budget.accountant) == (pld, "pld")
    assert budget.notes.endswith(got.notes)
    again = dpsgd_budget(noise_multiplier=z, sampling_rate=q, steps=steps, delta=delta)
    assert again == budget  # the kept step (SHARED_STEPS) gives the same numbers


def test_rdp_still_asked_where_it_can_win():
    # below PLD_MIN_NOISE only RDP is computed: dp-accounting's number, bit for bit
    q, z, steps, delta = 0.001, 0.2, 100, 1e-5
    budget = dpsgd_budget(noise_multiplier=z, sampling_rate=q, steps=steps, delta=delta)
    assert (budget.epsilon, budget.accountant) == (rdp_direct(q, z, steps, delta), "rdp")


def _dense_integer_rdp(q: np.ndarray, z: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """The integer-order series evaluated on the whole ``orders x (max + 1)`` grid (the layout
    privdl's function had before it was bucketed), terms outside ``2 <= k <= a`` at ``-inf``."""
    k = np.arange(int(orders.max()) + 1)[None, None, :]
    a = orders[None, :, None]
    qq, zz = q[:, None, None], z[:, None, None]
    valid = (k <= a) & (k >= 2)
    x = (k * k - k) / (2 * zz**2)
    with np.errstate(divide="ignore"):
        log_expm1 = np.where(x > 20.0, x + np.log1p(-np.exp(-np.minimum(x, 700.0))), 0.0)
        log_expm1 = np.where(x > 20.0, log_expm1, np.log(np.expm1(np.minimum(x, 20.0))))
    log_term = (
        gammaln(a + 1) - gammaln(k + 1) - gammaln(np.where(valid, a - k, 0) + 1)
        + k * np.log(qq) + (a - k) * np.log1p(-qq) + log_expm1
    )  # fmt: skip
    log_a_minus_1 = logsumexp(np.where(valid, log_term, -np.inf), axis=2)
    return np.logaddexp(0.0, log_a_minus_1) / (orders[None, :] - 1)


@pytest.mark.parametrize(
    "orders",
    [
        np.array([o for o in RDP_ORDERS if o == round(o)], float),
        np.arange(2.0, 65.0),
        np.array([2.0, 3.0, 129.0, 130.0, 700.0, 1001.0, 2500.0]),
    ],
    ids=["privdl-orders", "robust-hdp-orders", "odd-widths"],
)
def test_bucketed_integer_series_equals_the_dense_grid_to_the_last_bit(orders):
    rng = np.random.default_rng(0)
    q = np.concatenate([10 ** rng.uniform(-9, -0.01, 4), [1e-4, 0.5, 0.99]])
    z = np.concatenate([10 ** rng.uniform(-1.5, 6, 4), [0.3, 1.0, 1e3]])
    fast = poisson_rdp._rdp_integer(q, z, orders)
    dense = _dense_integer_rdp(q, z, orders)
    assert np.array_equal(fast, dense, equal_nan=True)


# ------------------------------------------------------------ DECOR on circulant graphs at scale
def _ring_like_graphs():
    return [nx.cycle_graph(14), nx.circulant_graph(15, [1, 3]), nx.complete_graph(9)]


def test_shift_invariance_is_recognised_and_only_where_it_holds():
    for g in _ring_like_graphs():
        assert shift_invariant(*edge_array(g))
    perm = np.random.default_rng(0).permutation(30)
    relabelled = nx.relabel_nodes(nx.cycle_graph(30), dict(enumerate(perm.tolist())))
    for g in (nx.path_graph(30), relabelled, nx.random_regular_graph(4, 30, seed=0)):
        assert not shift_invariant(*edge_array(g))


@pytest.mark.parametrize("adversary", ["eavesdropper", "curious", "collusion:2"])
def test_circulant_shortcuts_equal_the_full_computation(adversary):
    for g in _ring_like_graphs():
        kw = dict(sigma_cdp=1.0, sigma_cor=7.0, adversary=adversary)
        full = decor_step_rdp(g, method="sparse-selinv", **kw)  # type: ignore[arg-type]
        fast = decor_step_rdp(g, dense_limit=0, symmetry_min_nodes=0, **kw)  # type: ignore[arg-type]
        assert fast.method in ("circulant", "sparse-selinv+cyclic-symmetry", "fourier+deletion")
        rel = 2e-9 if fast.method == "fourier+deletion" else 1e-12  # rounded up by 1e-9
        assert fast.step_rdp == pytest.approx(full.step_rdp, rel=rel)
        assert fast.disconnected == full.disconnected


def test_circulant_diagonal_equals_a_dense_inverse():
    for g in _ring_like_graphs():
        n, edges = edge_array(g)
        for ratio in (0.1, 10.0, 1e3):
            sigma = np.eye(n) + ratio**2 * nx.laplacian_matrix(g, nodelist=range(n)).toarray()
            oracle = np.diag(np.linalg.inv(sigma))
            got = circulant_inverse_diagonal(n, edges, 1.0, ratio)
            assert np.allclose(oracle, got, rtol=1e-9, atol=0)


# ------------------------------------------------------- tori: translations as automorphisms
def _torus(r: int, c: int) -> nx.Graph:
    return nx.convert_node_labels_to_integers(nx.grid_2d_graph(r, c, periodic=True))


def test_torus_translations_are_recognised_and_only_where_they_hold():
    from privdl.accounting._graph import translation_shape

    assert translation_shape(*edge_array(_torus(5, 7))) == (5, 7)
    assert translation_shape(*edge_array(_torus(6, 6))) == (6, 6)
    assert translation_shape(*edge_array(nx.cycle_graph(12))) == (1, 12)
    perm = np.random.default_rng(1).permutation(35)
    relabelled = nx.relabel_nodes(_torus(5, 7), dict(enumerate(perm.tolist())))
    grid = nx.convert_node_labels_to_integers(nx.grid_2d_graph(5, 6))  # no wrap-around
    for g in (relabelled, grid, nx.random_regular_graph(4, 30, seed=0), nx.path_graph(30)):
        assert translation_shape(*edge_array(g)) is None


@pytest.mark.parametrize("adversary", ["eavesdropper", "curious", "collusion:2"])
def test_torus_shortcuts_equal_the_dense_oracle(adversary):
    graphs = (_torus(4, 6),) if adversary == "collusion:2" else (_torus(5, 7), _torus(4, 6))
    for g in graphs:
        kw = dict(sigma_cdp=1.0, sigma_cor=7.0, adversary=adversary)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a disconnecting pair warns on both sides
            oracle = decor_step_rdp(g, **kw)  # type: ignore[arg-type]  # dense, every set
            fast = decor_step_rdp(g, dense_limit=0, symmetry_min_nodes=0, **kw)  # type: ignore[arg-type]
        assert fast.method in (
            "translation-invariant",
            "sparse-selinv+translation-symmetry",
            "fourier+deletion",
        )
        rel = 2e-9 if fast.method == "fourier+deletion" else 1e-12  # rounded up by 1e-9
        assert fast.step_rdp == pytest.approx(oracle.step_rdp, rel=rel)
        assert fast.disconnected == oracle.disconnected


@pytest.mark.parametrize("ratio", [0.3, 7.0, 35.0, 1e3])
def test_curious_fourier_path_never_undercuts_the_dense_oracle(ratio):
    # the curious user on a ring / torus: FFT of the whole graph's inverse and a rank-deg
    # deletion update; rounded up by FOURIER_ROUND_UP, so never below the exact value
    from privdl.accounting.secrdp import FOURIER_MAX_COND

    for g in (_torus(5, 7), _torus(3, 9), nx.cycle_graph(12), nx.circulant_graph(15, [1, 3])):
        kw = dict(sigma_cdp=1.0, sigma_cor=ratio, adversary="curious")
        oracle = decor_step_rdp(g, **kw)  # type: ignore[arg-type]  # dense+lowrank, every vertex
        fast = decor_step_rdp(g, symmetry_min_nodes=0, **kw)  # type: ignore[arg-type]
        degree = max(d for _, d in g.degree())
        if 1 + 2 * degree * ratio**2 > FOURIER_MAX_COND:  # beyond: the exact paths
            assert fast.method != "fourier+deletion"
            assert fast.step_rdp == pytest.approx(oracle.step_rdp, rel=1e-9)
            continue
        assert fast.method == "fourier+deletion"
        assert oracle.step_rdp <= fast.step_rdp <= oracle.step_rdp * (1 + 1e-8)
