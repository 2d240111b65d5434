"""Invariants of D-SGD, the LDP baseline and DECOR (DECOR paper Section 3 and Algorithm 4, App. B.1)."""

import numpy as np
import pytest
import torch

from privdl.algorithms.base import Keys, StepSize
from privdl.algorithms.decor import Decor
from privdl.algorithms.dsgd import DSGD
from privdl.comm import LocalCommunicator
from privdl.engine.grads import ClipSpec, GradResult
from privdl.tasks import LeastSquaresTask
from privdl.topology import mixing_matrix, parse_graph


def _comm(spec, rule="metropolis"):
    topo = parse_graph(spec)
    return topo, LocalCommunicator(mixing_matrix(topo, rule), dtype=torch.float64)


def _run(algo, state, oracle, comm, steps):
    for _ in range(steps):
        state, _ = algo.step(state, oracle, comm)
    return state


def test_dsgd_without_noise_equals_numpy_recursion():
    """Zero noise, no clipping: x_{t+1} = W (x_t - eta grad L_i(x_t)), checked against numpy."""
    topo, comm = _comm("torus:3x3")
    task = LeastSquaresTask(topo.n, dim=4, seed=3, dtype=torch.float64)
    algo = DSGD(StepSize(0.05))
    state = _run(
        algo,
        algo.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(0)),
        task.oracle,
        comm,
        25,
    )
    w = mixing_matrix(topo, "metropolis").dense()
    a, b = task.problem.a_scale[:, None], task.problem.b
    x = np.ones((topo.n, 4))
    for _ in range(25):
        x = w @ (x - 0.05 * a * (a * x - b))
    assert np.allclose(state.params["x"].numpy(), x, atol=1e-12)


def test_dsgd_converges_to_least_squares_optimum_on_average():
    topo, comm = _comm("ring:8")
    task = LeastSquaresTask(topo.n, dim=5, seed=0, dtype=torch.float64)
    algo = DSGD(StepSize(0.2, decay=50.0))
    state = _run(
        algo,
        algo.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(0)),
        task.oracle,
        comm,
        3000,
    )
    xbar = state.params["x"].mean(0).numpy()
    assert np.linalg.norm(xbar - task.problem.x_star) < 2e-2


def test_decor_with_zero_sigma_cor_is_the_ldp_run_exactly():
    topo, comm = _comm("ring:6")
    task = LeastSquaresTask(topo.n, dim=3, seed=1, dtype=torch.float64)
    clip = ClipSpec(mode="batch_mean", threshold=1.0)
    ldp = DSGD(StepSize(0.05), clip=clip, sigma=0.7)
    dec = Decor(
        StepSize(0.05), edges=topo.edges, n_nodes=topo.n, clip=clip, sigma_cdp=0.7, sigma_cor=0.0
    )
    s1 = _run(
        ldp,
        ldp.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(5)),
        task.oracle,
        comm,
        20,
    )
    s2 = _run(
        dec,
        dec.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(5)),
        task.oracle,
        comm,
        20,
    )
    assert torch.equal(s1.params["x"], s2.params["x"])


class _LinearOracle:
    """L_i(x) = 1/2||x - b_i||^2: identical curvature, so sum_i grad_i depends on xbar only."""

    def __init__(self, b):
        self.b = b

    def __call__(self, params, t, *, clip):
        x = params["x"]
        return GradResult(
            grads={"x": x - self.b}, loss=torch.zeros(x.shape[0]), per_sample_norms=None
        )


@pytest.mark.parametrize("spec", ["ring:8", "torus:3x3", "er:10:0.5:2"])
def test_decor_average_does_not_see_correlated_noise(spec):
    """xbar evolves as xbar - (eta/n) sum_i (g_i + vbar_i) (eq. 33): sigma_cor never enters it."""
    topo, comm = _comm(spec)
    b = torch.randn(topo.n, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    oracle = _LinearOracle(b)
    x0 = {"x": torch.zeros(topo.n, 4, dtype=torch.float64)}
    runs = {}
    for sc in (0.0, 3.0, 50.0):
        algo = Decor(StepSize(0.1), edges=topo.edges, n_nodes=topo.n, sigma_cdp=0.5, sigma_cor=sc)
        runs[sc] = _run(
            algo, algo.init(dict(x0), oracle, comm, keys=Keys.from_seed(7)), oracle, comm, 15
        ).params["x"]
    for sc in (3.0, 50.0):
        assert torch.allclose(runs[sc].mean(0), runs[0.0].mean(0), atol=1e-10)
        # ... while the individual models do see it
        assert (runs[sc] - runs[0.0]).abs().max() > 0.1


def test_decor_on_complete_graph_with_J_equals_cdp_average():
    topo = parse_graph("complete:6")
    comm = LocalCommunicator(mixing_matrix(topo, "average"), dtype=torch.float64)
    task = LeastSquaresTask(topo.n, dim=3, seed=2, dtype=torch.float64)
    clip = ClipSpec(mode="batch_mean", threshold=0.5)
    dec = Decor(
        StepSize(0.05), edges=topo.edges, n_nodes=topo.n, clip=clip, sigma_cdp=0.3, sigma_cor=4.0
    )
    cdp = DSGD(StepSize(0.05), clip=clip, sigma=0.3)
    s1 = _run(
        dec,
        dec.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(9)),
        task.oracle,
        comm,
        10,
    )
    s2 = _run(
        cdp,
        cdp.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(9)),
        task.oracle,
        comm,
        10,
    )
    assert torch.allclose(s1.params["x"], s2.params["x"], atol=1e-10)


def test_decor_noise_is_fresh_every_step():
    """With zero gradients and no sigma_cdp, the models move differently at every step."""
    topo, comm = _comm("ring:5", "metropolis")

    def oracle(params, t, *, clip):  # zero gradients: only the noise moves the models
        x = params["x"]
        return GradResult(
            grads={"x": torch.zeros_like(x)}, loss=torch.zeros(x.shape[0]), per_sample_norms=None
        )

    algo = Decor(StepSize(1.0), edges=topo.edges, n_nodes=topo.n, sigma_cdp=0.0, sigma_cor=1.0)
    state = algo.init(
        {"x": torch.zeros(topo.n, 3, dtype=torch.float64)}, oracle, comm, keys=Keys.from_seed(1)
    )
    moves = []
    for _ in range(3):
        before = state.params["x"].clone()
        state, _ = algo.step(state, oracle, comm)
        moves.append(state.params["x"] - before)
        assert abs(float(state.params["x"].sum())) < 1e-12  # cancellation: the sum stays 0
    assert not torch.allclose(moves[0], moves[1]) and not torch.allclose(moves[1], moves[2])
    c = np.corrcoef(moves[0].ravel().numpy(), moves[1].ravel().numpy())[0, 1]
    assert abs(c) < 0.9


def test_background_noise_equals_inline_noise_bitwise(monkeypatch):
    """DECOR and LDP draw their noise in a worker thread, one step ahead (during the previous
    step); forcing the draws inline must give the same iterates bit for bit (no shared state
    between the two)."""
    import privdl.algorithms.base as base_mod

    topo, comm = _comm("torus:3x3")
    task = LeastSquaresTask(topo.n, dim=6, seed=2, dtype=torch.float64)
    clip = ClipSpec(mode="batch_mean", threshold=1.0)
    algos = [
        DSGD(StepSize(0.05), clip=clip, sigma=0.3),
        Decor(
            StepSize(0.05), edges=topo.edges, n_nodes=topo.n, clip=clip, sigma_cdp=0.2,
            sigma_cor=0.9,
        ),
    ]  # fmt: skip
    background = [
        _run(
            a,
            a.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(4)),
            task.oracle,
            comm,
            15,
        )
        for a in algos
    ]

    def inline(fn, *, device):
        value = fn()
        return lambda: value

    monkeypatch.setattr(base_mod, "in_background", inline)  # D-SGD's step is DECOR's
    for algo, state in zip(algos, background, strict=True):
        again = _run(
            algo,
            algo.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(4)),
            task.oracle,
            comm,
            15,
        )
        assert torch.equal(again.params["x"], state.params["x"])


def test_noise_drawn_ahead_serves_only_its_own_run_and_step(monkeypatch):
    """Two DECOR runs stepped in turn, one of them re-running a step from an older state and
    one resumed from a copy of its state (new key tuples): every iterate equals the same run
    alone, step by step, with no draw ahead (the cache cleared before every step)."""
    import privdl.algorithms.base as base_mod

    monkeypatch.setattr(base_mod, "spare_cpus", lambda: 1)  # a core beside torch's threads

    topo, comm = _comm("ring:6")
    task = LeastSquaresTask(topo.n, dim=5, seed=1, dtype=torch.float64)
    algo = Decor(StepSize(0.05), edges=topo.edges, n_nodes=topo.n, sigma_cdp=0.2, sigma_cor=0.7)

    def start(seed):
        return algo.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(seed))

    def alone(state, steps):
        for _ in range(steps):
            base_mod._AHEAD.clear()
            state, _ = algo.step(state, task.oracle, comm)
        return state

    a, b = start(1), start(2)
    a0 = a
    for _ in range(3):
        a, _ = algo.step(a, task.oracle, comm)
        b, _ = algo.step(b, task.oracle, comm)
    rerun, _ = algo.step(a0, task.oracle, comm)  # step 0 again: not served step 3's draw
    assert torch.equal(rerun.params["x"], alone(start(1), 1).params["x"])
    copied = type(a)(**{**a.__dict__, "edge_keys": tuple(bytes(k) for k in a.edge_keys)})
    resumed, _ = algo.step(copied, task.oracle, comm)
    a, _ = algo.step(a, task.oracle, comm)
    assert torch.equal(a.params["x"], alone(start(1), 4).params["x"])
    assert torch.equal(resumed.params["x"], a.params["x"])
    assert torch.equal(b.params["x"], alone(start(2), 3).params["x"])
    assert not torch.equal(a.params["x"], alone(start(2), 4).params["x"])
    assert base_mod._AHEAD  # the default drew ahead; draw_ahead=False does not
    base_mod._AHEAD.clear()
    inline = Decor(StepSize(0.05), edges=topo.edges, n_nodes=topo.n, sigma_cdp=0.2, sigma_cor=0.7,
                   draw_ahead=False)  # fmt: skip
    state = inline.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(1))
    state, _ = inline.step(state, task.oracle, comm)
    assert not base_mod._AHEAD
    assert torch.equal(state.params["x"], alone(start(1), 1).params["x"])


def test_in_background_returns_the_value_and_reraises():
    from privdl.algorithms.base import in_background
    from privdl.errors import ConfigError

    assert in_background(lambda: 41 + 1, device=torch.device("cpu"))() == 42

    def boom():
        raise ConfigError("bad draw")

    get = in_background(boom, device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="bad draw"):
        get()
    calls = []
    get = in_background(lambda: calls.append(1) or 7, device=torch.device("meta"))
    assert calls == [1] and get() == 7  # not a CPU: run inline, at once


def test_noise_drawn_inline_where_torch_takes_every_core(monkeypatch):
    """With no CPU beside torch's threads the draw runs in the calling thread at once (a worker
    would only preempt them), nothing is drawn ahead, errors still come from the getter, and
    the iterates equal those drawn in the worker."""
    import threading

    import privdl.algorithms.base as base_mod
    from privdl.errors import ConfigError

    where = []
    monkeypatch.setattr(base_mod, "spare_cpus", lambda: 0)
    get = base_mod.in_background(lambda: where.append(threading.get_ident()) or 5, device="cpu")
    assert where[-1] == threading.get_ident() and get() == 5

    def boom():
        raise ConfigError("bad draw")

    get = base_mod.in_background(boom, device="cpu")
    with pytest.raises(ConfigError, match="bad draw"):
        get()

    topo, comm = _comm("ring:6")
    task = LeastSquaresTask(topo.n, dim=5, seed=1, dtype=torch.float64)
    algo = Decor(StepSize(0.05), edges=topo.edges, n_nodes=topo.n, sigma_cdp=0.2, sigma_cor=0.7)

    def run():
        state = algo.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(3))
        for _ in range(4):
            state, _ = algo.step(state, task.oracle, comm)
        return state.params["x"]

    base_mod._AHEAD.clear()
    inline = run()
    assert not base_mod._AHEAD
    monkeypatch.setattr(base_mod, "spare_cpus", lambda: 1)
    assert torch.equal(run(), inline)
    assert base_mod._AHEAD
    base_mod.finish_drawn_ahead()
