"""The SecRDP accountant for edge-wise noise designs against a naive dense loop and DECOR's."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from privdl.accounting.decor import account_decor
from privdl.accounting.design import account_design, design_step_rdp
from privdl.accounting.secrdp import decor_step_rdp
from privdl.errors import PrivacyError
from privdl.mechanisms.noise_design import NoiseDesign
from privdl.topology.graphs import erdos_renyi, random_regular, ring

pytestmark = pytest.mark.filterwarnings("ignore::privdl.accounting.secrdp.PrivacyWarning")


def _oracle(topo, design: NoiseDesign, q: int) -> float:
    """2 max_I max_i [Sigma_I^{-1}]_ii from the dense covariance, rows and columns deleted."""
    sigma = design.covariance()
    n = topo.n
    best = -np.inf
    for subset in itertools.combinations(range(n), q):
        keep = np.setdiff1d(np.arange(n), subset)
        # the colluders' edges are known to them: Sigma_I is the covariance of the honest
        # nodes' noise given those edges' streams, i.e. diag(s_H^2) + L_H(w)
        sub = sigma[np.ix_(keep, keep)].copy()
        for e, (u, v) in enumerate(design.edges):
            if (u in subset) != (v in subset):
                h = v if u in subset else u
                sub[list(keep).index(h), list(keep).index(h)] -= design.edge_var[e]
        best = max(best, float(np.max(np.diag(np.linalg.inv(sub)))))
    return 2.0 * best


def _random_design(topo, seed: int, ratio: float = 5.0) -> NoiseDesign:
    rng = np.random.default_rng(seed)
    return NoiseDesign(
        rng.uniform(0.2, 2.0, topo.n), ratio * rng.uniform(0.0, 2.0, topo.num_edges), topo.edges
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("adversary,q", [("eavesdropper", 0), ("curious", 1), ("collusion:2", 2)])
def test_grounded_matches_dense_oracle_on_random_graphs(seed: int, adversary: str, q: int) -> None:
    topo = erdos_renyi(9, 0.5, seed) if seed % 2 else random_regular(10, 3, seed)
    design = _random_design(topo, seed)
    want = _oracle(topo, design, q)
    got = design_step_rdp(topo, design, adversary=adversary).step_rdp
    naive = design_step_rdp(topo, design, adversary=adversary, method="naive").step_rdp
    assert got == pytest.approx(want, rel=1e-9)
    assert naive == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("adversary", ["eavesdropper", "curious", "collusion:2"])
@pytest.mark.parametrize("ratio", [0.3, 10.0, 1e4])
def test_uniform_design_equals_decor_accountant(adversary: str, ratio: float) -> None:
    topo = erdos_renyi(10, 0.5, 4)
    design = NoiseDesign.uniform(topo.edges, topo.n, sigma_cdp=0.8, sigma_cor=0.8 * ratio)
    want = decor_step_rdp(topo.graph, sigma_cdp=0.8, sigma_cor=0.8 * ratio, adversary=adversary)
    assert design_step_rdp(topo, design, adversary=adversary) == want  # auto: the same code
    grounded = design_step_rdp(topo, design, adversary=adversary, method="grounded")
    assert grounded.step_rdp == pytest.approx(want.step_rdp, rel=1e-9)
    eps = account_design(
        topo, design, steps=100, delta=1e-5, adversary=adversary, method="grounded"
    )
    ref = account_decor(
        topo.graph, sigma_cdp=0.8, sigma_cor=0.8 * ratio, steps=100, delta=1e-5, adversary=adversary
    )
    assert eps.epsilon == pytest.approx(ref.epsilon, rel=1e-8)
    assert eps.budget.label() == ref.budget.label()


def test_large_edge_variance_keeps_its_accuracy() -> None:
    """w >> s^2: the answer tends to the CDP-like 1/sum(s^2); a plain inverse loses it."""
    topo = ring(12)
    rng = np.random.default_rng(0)
    node = rng.uniform(0.5, 1.5, 12)
    for w in (1e6, 1e10):
        design = NoiseDesign(node, np.full(12, w), topo.edges)
        got = design_step_rdp(topo, design, method="grounded").step_rdp / 2.0
        assert 1.0 / node.sum() < got < 1.0 / node.sum() * (1 + 10 * 12 / w)


def test_component_without_independent_noise_is_refused() -> None:
    topo = ring(6)
    node = np.array([1.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    design = NoiseDesign(node, np.ones(6), topo.edges)
    assert np.isfinite(design_step_rdp(topo, design).step_rdp)  # connected: fine
    with pytest.raises(PrivacyError, match="no independent noise"):
        design_step_rdp(topo, design, adversary="collusion:2")  # {0, 5} cut off 1..4
