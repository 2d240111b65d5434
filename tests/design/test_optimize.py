"""The noise-design optimizer: first-order vs the conic solution, certificates, DECOR's scalar."""

from __future__ import annotations

import numpy as np
import pytest

from privdl.accounting.design import account_design, design_step_rdp
from privdl.design.api import design_noise
from privdl.design.convex import solve_convex, solve_whisper
from privdl.design.first_order import ConstraintOracle, WorkingSetOracle, solve_first_order
from privdl.design.objective import best_scalar, make_problem, residual_matrix
from privdl.mechanisms.noise_design import NoiseDesign
from privdl.topology.graphs import erdos_renyi, ring
from privdl.topology.mixing import mixing_matrix

pytestmark = pytest.mark.filterwarnings("ignore::privdl.accounting.secrdp.PrivacyWarning")


def _problem(topo, adversary: str, horizon: int = 3):
    mix = mixing_matrix(topo, "metropolis").dense()
    return make_problem(topo, mix, horizon=horizon, adversary=adversary), mix


def test_residual_matrix_is_the_sum_of_gossip_powers() -> None:
    topo = erdos_renyi(9, 0.5, 2)
    mix = mixing_matrix(topo, "metropolis").dense()
    want = sum(np.linalg.matrix_power(mix, k).T @ np.linalg.matrix_power(mix, k) for k in (1, 2, 3))
    np.testing.assert_allclose(residual_matrix(mix, 3), want, atol=1e-12)
    problem, _ = _problem(topo, "eavesdropper")
    rng = np.random.default_rng(0)
    from privdl.mechanisms.noise_design import NoiseDesign

    design = NoiseDesign(rng.uniform(size=9), rng.uniform(size=topo.num_edges), topo.edges)
    value = problem.objective(design.node_var, design.edge_var)
    assert value == pytest.approx(float(np.trace(want @ design.covariance())), rel=1e-12)


@pytest.mark.parametrize(
    "n,p,seed,adversary",
    [(6, 0.6, 1, "eavesdropper"), (5, 0.7, 2, "curious"), (5, 0.8, 1, "collusion:2"),
     pytest.param(6, 0.7, 1, "collusion:2", marks=pytest.mark.slow),
     pytest.param(8, 0.5, 1, "eavesdropper", marks=pytest.mark.slow),
     pytest.param(10, 0.4, 2, "eavesdropper", marks=pytest.mark.slow),
     pytest.param(7, 0.6, 3, "curious", marks=pytest.mark.slow)],
)  # fmt: skip
def test_first_order_matches_conic_solution(n: int, p: float, seed: int, adversary: str) -> None:
    topo = erdos_renyi(n, p, seed)
    problem, _ = _problem(topo, adversary)
    s2, c2, scalar = best_scalar(topo, problem)
    node, edge, info = solve_first_order(problem, (np.full(n, s2), np.full(topo.num_edges, c2)))
    cnode, cedge, _ = solve_convex(problem)
    oracle = ConstraintOracle.of(problem)
    assert oracle.values(oracle.inverses(node, edge)).max() <= 1.0 + 1e-12
    fmax = oracle.values(oracle.inverses(cnode, cedge)).max()  # the conic point, made feasible
    conic = problem.objective(cnode, cedge) * fmax
    assert problem.objective(node, edge) == pytest.approx(conic, rel=1e-4)
    assert problem.objective(node, edge) <= scalar * (1 + 1e-12)


@pytest.mark.parametrize(
    "seed", [0, 1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]
)
def test_certified_and_never_worse_than_decor_scalar(seed: int) -> None:
    rng = np.random.default_rng(seed)
    topo = erdos_renyi(int(rng.integers(6, 10)), float(rng.uniform(0.3, 0.8)), seed)
    adversary = ["eavesdropper", "curious"][seed % 2]
    epsilon = float(rng.choice([1.0, 3.0, 10.0]))
    result = design_noise(
        topo, epsilon=epsilon, delta=1e-5, steps=int(rng.integers(10, 500)), clip=1.0,
        adversary=adversary, horizon=int(rng.integers(1, 6)), solver="first-order",
    )  # fmt: skip
    assert result.account.epsilon <= epsilon
    assert result.account.epsilon > epsilon * 0.999  # calibrated, not wasted
    again = account_design(
        topo, result.design, clip=1.0, steps=result.design.metadata["steps"], delta=1e-5,
        adversary=adversary, method="naive",
    )  # fmt: skip
    assert again.epsilon <= epsilon * (1 + 1e-9)
    assert result.residual <= result.residual_decor * (1 + 1e-9)
    assert result.residual_cdp < result.residual <= result.residual_ldp * (1 + 1e-9)


def test_edge_optimized_beats_decor_by_ten_percent_on_irregular_graphs() -> None:
    for p, seed in [(0.2, 1), (0.4, 2), (0.6, 3)]:
        topo = erdos_renyi(20, p, seed)
        result = design_noise(topo, epsilon=10.0, delta=1e-5, steps=100, horizon=1, solver="cvxpy")
        assert result.residual_ratio_vs_decor <= 0.9, (p, result.residual_ratio_vs_decor)


def test_whisper_free_covariance_is_a_lower_reference_for_the_eavesdropper() -> None:
    topo = ring(8)
    problem, mix = _problem(topo, "eavesdropper", horizon=1)
    sigma, _ = solve_whisper(residual_matrix(mix, 1))
    fmax = float(np.max(np.diag(np.linalg.inv(sigma))))
    whisper = float(np.trace(residual_matrix(mix, 1) @ sigma)) * fmax
    node, edge, _ = solve_convex(problem)
    oracle = ConstraintOracle.of(problem)
    ours = problem.objective(node, edge) * oracle.values(oracle.inverses(node, edge)).max()
    assert whisper <= ours * (1 + 1e-6)  # the free covariance contains every edge-wise design


def test_whisper_by_scs_above_the_interior_point_limit_matches_clarabel(monkeypatch) -> None:
    """The large-n route (SCS at tight tolerances) against the interior-point one (Clarabel) on
    the same problem: their certified objectives (each made feasible) agree to 1e-4."""
    from privdl.design import convex

    topo = erdos_renyi(12, 0.4, 1)
    m = residual_matrix(mixing_matrix(topo, "metropolis").dense(), 3)

    def certified() -> tuple[float, str]:
        sigma, facts = solve_whisper(m)
        return float(np.trace(m @ sigma)) * float(np.max(np.diag(np.linalg.inv(sigma)))), facts[
            "solver"
        ]

    ipm, ipm_solver = certified()
    monkeypatch.setattr(convex, "WHISPER_IPM_LIMIT", 5)
    first_order, fo_solver = certified()
    assert (ipm_solver, fo_solver) == ("CLARABEL", "SCS")
    assert first_order == pytest.approx(ipm, rel=1e-4)


@pytest.mark.parametrize("seed", range(3))
def test_curious_deletion_form_matches_one_inverse_per_deleted_vertex(seed: int) -> None:
    rng = np.random.default_rng(seed)
    topo = erdos_renyi(
        int(rng.integers(7, 12)), float(rng.uniform(0.3, 0.7)), seed, require_connected=False
    )
    problem, _ = _problem(topo, "curious")
    dense, low = (
        ConstraintOracle.of(problem, deletion=False),
        ConstraintOracle.of(problem, deletion=True),
    )
    node = rng.uniform(0.05, 2.0, topo.n)
    edge = rng.uniform(0.0, 30.0, topo.num_edges) * (rng.uniform(size=topo.num_edges) > 0.2)
    want, got = dense.inverses(node, edge), low.inverses(node, edge)
    np.testing.assert_allclose(low.values(got), dense.values(want), rtol=1e-9)
    sparse = 0.97 if seed == 1 else 0.5  # seed 1: few active constraints (the sparse product)
    mu = rng.uniform(size=(topo.n, topo.n - 1)) * (rng.uniform(size=(topo.n, topo.n - 1)) > sparse)
    np.testing.assert_allclose(
        low.gradient(got, mu), dense.gradient(want, mu), rtol=1e-8, atol=1e-12
    )
    # the oracle's gradient is the derivative of sum mu f (central differences, the dense form)
    x = np.concatenate([node, edge])
    step = 1e-6 * np.maximum(x, 1e-3)
    k = int(rng.integers(topo.n, len(x)))
    up, down = x.copy(), x.copy()
    up[k] += step[k]
    down[k] -= step[k]
    f = lambda z: float((mu * low.values(low.inverses(z[: topo.n], z[topo.n :]))).sum())  # noqa: E731
    assert low.gradient(got, mu)[k] == pytest.approx((f(up) - f(down)) / (2 * step[k]), rel=1e-5)


@pytest.mark.parametrize("n,p,seed", [(9, 0.5, 1), (10, 0.4, 2)])
def test_curious_first_order_by_deletion_matches_conic_solution(
    n: int, p: float, seed: int
) -> None:
    """The solver on the low-rank deletion form (the large-n path, forced here) reaches the conic
    optimum of the curious-user design, and the accountant (its own code) certifies the point."""
    topo = erdos_renyi(n, p, seed)
    problem, _ = _problem(topo, "curious", horizon=10)
    s2, c2, scalar = best_scalar(topo, problem)
    node, edge, info = solve_first_order(
        problem, (np.full(n, s2), np.full(topo.num_edges, c2)), deletion=True
    )
    assert info["converged"]
    cnode, cedge, _ = solve_convex(problem)
    dense = ConstraintOracle.of(problem, deletion=False)  # one plain inverse per deleted vertex
    conic = problem.objective(cnode, cedge) * dense.values(dense.inverses(cnode, cedge)).max()
    assert problem.objective(node, edge) == pytest.approx(conic, rel=1e-4)
    design = NoiseDesign(node, edge, topo.edges)
    for method in ("lowrank", "naive"):
        step = design_step_rdp(topo, design, adversary="curious", method=method)
        assert step.step_rdp / 2.0 <= 1.0 + 1e-9


@pytest.mark.parametrize("seed", range(2))
def test_working_set_oracle_matches_one_inverse_per_deleted_vertex(seed: int) -> None:
    rng = np.random.default_rng(seed)
    topo = erdos_renyi(
        int(rng.integers(7, 12)), float(rng.uniform(0.3, 0.7)), seed, require_connected=False
    )
    n = topo.n
    problem, _ = _problem(topo, "curious")
    dense = ConstraintOracle.of(problem, deletion=False)
    jj, ii = np.nonzero(~np.eye(n, dtype=bool))  # every pair, in the dense oracle's order
    pick = rng.uniform(size=len(jj)) < 0.6  # and a working set of some of them
    node = rng.uniform(0.05, 2.0, n)
    edge = rng.uniform(0.0, 30.0, topo.num_edges) * (rng.uniform(size=topo.num_edges) > 0.2)
    want = dense.inverses(node, edge)
    mu = rng.uniform(size=(n, n - 1)) * pick.reshape(n, n - 1)
    for keep in (np.ones(len(jj), dtype=bool), pick):
        ws = WorkingSetOracle.of(problem, jj[keep], ii[keep])
        got = ws.inverses(node, edge)
        np.testing.assert_allclose(ws.values(got)[0], dense.values(want).ravel()[keep], rtol=1e-9)
        np.testing.assert_allclose(
            ws.gradient(got, mu.ravel()[keep][None]), dense.gradient(want, mu), rtol=1e-8,
            atol=1e-12,
        )  # fmt: skip


@pytest.mark.slow  # about 20 s: thousands of evaluations at n = 6
def test_working_set_solver_matches_conic_solution() -> None:
    topo = erdos_renyi(6, 0.6, 1)
    problem, _ = _problem(topo, "curious")
    s2, c2, scalar = best_scalar(topo, problem)
    start = (np.full(topo.n, s2), np.full(topo.num_edges, c2))
    node, edge, info = solve_first_order(problem, start, working_set=True)
    assert info["converged"] and info["rounds"] >= 1
    cnode, cedge, _ = solve_convex(problem)
    oracle = ConstraintOracle.of(problem)
    assert oracle.values(oracle.inverses(node, edge)).max() <= 1.0 + 1e-12  # over every pair
    conic = problem.objective(cnode, cedge) * oracle.values(oracle.inverses(cnode, cedge)).max()
    assert problem.objective(node, edge) == pytest.approx(conic, rel=1e-4)


@pytest.mark.parametrize("seed", range(2))
def test_working_set_design_is_certified_over_every_deleted_vertex(seed: int) -> None:
    """Stopped early (the working set then misses pairs), the point is still scaled by the
    largest constraint over every pair: the accountant's slope (one plain inverse per deleted
    vertex) is at most b = 1 and the residual no worse than DECOR's pair."""
    from privdl.accounting.design import design_step_rdp
    from privdl.mechanisms.noise_design import NoiseDesign

    rng = np.random.default_rng(seed)
    topo = erdos_renyi(int(rng.integers(10, 16)), float(rng.uniform(0.2, 0.5)), seed)
    problem, _ = _problem(topo, "curious")
    s2, c2, scalar = best_scalar(topo, problem)
    start = (np.full(topo.n, s2), np.full(topo.num_edges, c2))
    node, edge, _ = solve_first_order(problem, start, working_set=True, max_seconds=1.0)
    step = design_step_rdp(
        topo, NoiseDesign(node, edge, topo.edges), adversary="curious", method="naive"
    )
    assert step.step_rdp / 2.0 <= 1.0 + 1e-9
    assert problem.objective(node, edge) <= scalar * (1 + 1e-12)
