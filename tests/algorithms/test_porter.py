"""PORTER / PORTER-DP / PORTER-GC / BEER and SoteriaFL-SGD against independent oracles
(PORTER paper Algorithm 1; docs/porter.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from privdl.algorithms.base import Keys, StepSize
from privdl.algorithms.porter import (
    Porter,
    beer,
    best_constant_mixing,
    channel_generator,
    fdla_mixing,
    mixing_rate,
    porter_dp,
    porter_gc,
)
from privdl.algorithms.soteria import SoteriaFL, shift_step
from privdl.comm.local import LocalCommunicator
from privdl.engine.clipping import clip_by_global_norm
from privdl.engine.grads import ClipSpec, GradResult
from privdl.errors import ConfigError
from privdl.experiments.porter import NonconvexLogisticTask, _batch_index
from privdl.mechanisms.compress import Identity, RandomK
from privdl.mechanisms.correlated import independent_noise
from privdl.mechanisms.secrets import node_noise_keys
from privdl.topology import parse_graph
from privdl.topology.mixing import MixingMatrix

N, D = 5, 8


class Quadratic:
    """f_i(x) = 1/2 ||A_i x - b_i||^2 plus a t-keyed perturbation (a deterministic 'minibatch')."""

    def __init__(self, n: int = N, d: int = D, seed: int = 0, noise: float = 0.3) -> None:
        g = torch.Generator().manual_seed(seed)
        self.a = torch.randn(n, d, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        self.b = torch.randn(n, d, generator=g, dtype=torch.float64)
        self.noise, self.n, self.d = noise, n, d

    def grad(self, x: torch.Tensor, t: int) -> torch.Tensor:
        g = torch.einsum("nji,nj->ni", self.a, torch.einsum("nij,nj->ni", self.a, x) - self.b)
        pert = torch.randn(
            x.shape, generator=torch.Generator().manual_seed(1000 + t), dtype=x.dtype
        )
        return g + self.noise * pert

    def oracle(self, params, t, *, clip: ClipSpec) -> GradResult:
        g = {"x": self.grad(params["x"], t)}
        if clip.mode != "none":
            g = clip_by_global_norm(g, clip.threshold, kind=clip.kind)
        return GradResult(g, torch.zeros(params["x"].shape[0], dtype=torch.float64))

    def full_grad_mean(self, x: torch.Tensor) -> torch.Tensor:
        xs = x.expand(self.n, -1)
        r = torch.einsum("nij,nj->ni", self.a, xs) - self.b
        return torch.einsum("nji,nj->ni", self.a, r).mean(0)


def _comm(n: int = N) -> tuple[LocalCommunicator, np.ndarray]:
    w = best_constant_mixing(parse_graph(f"er:{n}:0.8:1"))
    return LocalCommunicator(w, dtype=torch.float64), w.dense()


def _x0(n: int = N, d: int = D) -> dict[str, torch.Tensor]:
    x0 = torch.randn(d, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    return {"x": x0.expand(n, -1).clone()}


def test_tracker_mean_equals_mean_noisy_gradient_every_step():
    """§8.1-8.3: mean v = mean g_p (noise included); x_bar runs noisy SGD; first step closed form."""
    task, (comm, _) = Quadratic(), _comm()
    alg = Porter(StepSize(0.05), 0.2, RandomK(k=2), ClipSpec("batch_mean", 1.0, "smooth"), 0.5)
    state = alg.init(_x0(), task.oracle, comm, keys=Keys.from_seed(3))
    x0 = state.params["x"].clone()
    for t in range(25):
        xbar_prev = state.params["x"].mean(0)
        state, info = alg.step(state, task.oracle, comm)
        g_p = info["g_p"]
        torch.testing.assert_close(state.v.mean(0), g_p.mean(0), rtol=0, atol=1e-12)
        torch.testing.assert_close(
            state.params["x"].mean(0), xbar_prev - 0.05 * g_p.mean(0), rtol=0, atol=1e-12
        )
        if t == 0:
            assert torch.equal(state.q_v, torch.zeros_like(state.q_v))
            torch.testing.assert_close(state.v, g_p, rtol=0, atol=0)
            torch.testing.assert_close(state.params["x"], x0 - 0.05 * g_p, rtol=0, atol=1e-14)
    assert info["bits_per_node"] == 2 * RandomK(k=2).bits(D)


def test_identity_compressor_is_gradient_tracking_on_regularised_mixing():
    """§2.6/§8.4: with C = id, PORTER-DP is GT on W_hat = I + gamma (W - I), same draws."""
    task, (comm, w) = Quadratic(), _comm()
    gamma, eta, sigma, seed = 0.6, 0.05, 0.2, 11
    alg = Porter(StepSize(eta), gamma, Identity(), ClipSpec("batch_mean", 2.0, "hard"), sigma)
    state = alg.init(_x0(), task.oracle, comm, keys=Keys.from_seed(seed))
    # independent numpy implementation (rows = agents)
    w_hat = np.eye(N) + gamma * (w - np.eye(N))
    keys = node_noise_keys(range(N), seed=seed)
    x = _x0()["x"].numpy().copy()
    v = np.zeros_like(x)
    g_prev = np.zeros_like(x)
    for t in range(30):
        state, _ = alg.step(state, task.oracle, comm)
        g = task.grad(torch.from_numpy(x), t).numpy()
        g = g * np.minimum(1.0, 2.0 / np.linalg.norm(g, axis=1, keepdims=True))
        g = g + independent_noise(keys, t, D, sigma=sigma, dtype=torch.float64).numpy()
        v = w_hat @ v + g - g_prev
        g_prev = g
        x = w_hat @ x - eta * v
        np.testing.assert_allclose(state.params["x"].numpy(), x, rtol=0, atol=1e-12)
        np.testing.assert_allclose(state.v.numpy(), v, rtol=0, atol=1e-12)


def test_stored_previous_noisy_gradient_is_reused():
    """G_p^{t-1} in (12) is the stored draw: v^{t+1} - v^t - gamma (W-I) q_v^{t+1} = g^{t+1} - g^t."""
    task, (comm, w) = Quadratic(), _comm()
    alg = Porter(StepSize(0.05), 0.3, RandomK(k=3), ClipSpec(), 1.0)
    state = alg.init(_x0(), task.oracle, comm, keys=Keys.from_seed(5))
    state, info = alg.step(state, task.oracle, comm)
    g1 = info["g_p"]
    assert torch.equal(state.g_prev, g1)
    clean = task.grad(_x0()["x"], 0)
    assert (g1 - clean).abs().max() > 0.1  # the stored value carries its noise realisation
    v1 = state.v.clone()
    state, info = alg.step(state, task.oracle, comm)
    lap = torch.from_numpy(w - np.eye(N))
    torch.testing.assert_close(
        state.v - v1 - 0.3 * lap @ state.q_v, info["g_p"] - g1, rtol=0, atol=1e-12
    )


def test_one_agent_porter_dp_is_dp_sgd_with_per_sample_smooth_clipping():
    """§8.6: n = 1 gives x <- x - eta (mean_s Clip_tau(grad l(x; z_s)) + e); autograd loop oracle."""
    g = torch.Generator().manual_seed(0)
    feats = (torch.rand(1, 40, 6, generator=g) < 0.4).to(torch.float64)
    labels = torch.where(torch.rand(1, 40, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    task = NonconvexLogisticTask(feats, labels, feats[0], labels[0], lam=0.2, batch_size=4, seed=2)
    comm = LocalCommunicator(MixingMatrix("one", sp.csr_matrix([[1.0]])))
    tau, eta, sigma, seed = 0.5, 0.3, 0.4, 9
    alg = porter_dp(step_size=eta, gamma=0.5, compressor=RandomK(k=1), tau=tau, sigma_p=sigma)
    state = alg.init(task.init_params(seed=1), task.oracle, comm, keys=Keys.from_seed(seed))
    x = task.init_params(seed=1)["x"][0].clone()
    keys = node_noise_keys(range(1), seed=seed)
    for t in range(10):
        state, _ = alg.step(state, task.oracle, comm)
        idx = _batch_index(torch.tensor([40]), 4, 2, t)[0]
        total = torch.zeros_like(x)
        for s in idx.tolist():  # slow one-sample loop
            xs = x.clone().requires_grad_(True)
            loss = torch.log1p(torch.exp(-labels[0, s] * (feats[0, s] @ xs)))
            loss = loss + 0.2 * (xs**2 / (1 + xs**2)).sum()
            (gs,) = torch.autograd.grad(loss, xs)
            total += tau / (tau + gs.norm()) * gs
        noise = independent_noise(keys, t, 6, sigma=sigma, dtype=torch.float64)[0]
        x = x - eta * (total / 4 + noise)
        torch.testing.assert_close(state.params["x"][0], x, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["smooth", "hard"])
def test_clipped_norms_never_exceed_tau(kind):
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(3, 50, 10, generator=g, dtype=torch.float64) * 5
    labels = torch.where(torch.rand(3, 50, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    task = NonconvexLogisticTask(feats, labels, feats[0], labels[0], batch_size=1, seed=0)
    params = {"x": torch.randn(3, 10, generator=g, dtype=torch.float64) * 3}
    tau = 0.7
    for t in range(20):
        res = task.oracle(params, t, clip=ClipSpec("per_sample", tau, kind))
        assert bool((res.grads["x"].norm(dim=1) <= tau + 1e-12).all())  # b = 1: one clipped grad
        raw = task.oracle(params, t, clip=ClipSpec())
        torch.testing.assert_close(res.per_sample_norms[:, 0], raw.grads["x"].norm(dim=1))
        gc = task.oracle(params, t, clip=ClipSpec("batch_mean", tau, kind))
        assert bool((gc.grads["x"].norm(dim=1) <= tau + 1e-12).all())
    if kind == "smooth":  # norm tau ||g|| / (tau + ||g||) exactly
        nrm = raw.grads["x"].norm(dim=1)
        torch.testing.assert_close(gc.grads["x"].norm(dim=1), tau * nrm / (tau + nrm))


def test_porter_gc_with_inactive_hard_clip_and_porter_dp_without_noise_equal_beer():
    """§8.5: the same recursion when the clip never binds and sigma_p = 0."""
    task, (comm, _) = Quadratic(), _comm()
    runs = []
    for alg in (
        beer(step_size=0.05, gamma=0.2, compressor=RandomK(k=3)),
        porter_gc(step_size=0.05, gamma=0.2, compressor=RandomK(k=3), tau=1e9, clip_kind="hard"),
    ):
        state = alg.init(_x0(), task.oracle, comm, keys=Keys.from_seed(4))
        for _ in range(15):
            state, _ = alg.step(state, task.oracle, comm)
        runs.append(state.params["x"])
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=1e-14)


def test_deterministic_porter_reaches_consensus_and_stationarity():
    """§8.7: full gradients, random-k, small gamma: consensus error and ||grad f(x_bar)|| -> 0."""
    task, (comm, _) = Quadratic(noise=0.0), _comm()
    alg = beer(step_size=0.2, gamma=0.3, compressor=RandomK(k=4))
    state = alg.init(_x0(), task.oracle, comm, keys=Keys.from_seed(0))
    first = float(task.full_grad_mean(state.params["x"].mean(0)).norm())
    for _ in range(600):
        state, _ = alg.step(state, task.oracle, comm)
    x = state.params["x"]
    assert float((x - x.mean(0)).norm()) < 1e-8
    assert float(task.full_grad_mean(x.mean(0)).norm()) < 1e-8 * first


def test_channels_and_rounds_draw_independent_masks():
    comp, x = RandomK(k=5), torch.ones(4, 100)
    masks = [
        comp(x, generator=channel_generator(0, ch, t, torch.device("cpu")))
        for ch, t in (("v", 3), ("x", 3), ("v", 4))
    ]
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[0], masks[2])
    assert not torch.equal(masks[0][0], masks[0][1])  # rows (agents) differ within a call
    again = comp(x, generator=channel_generator(0, "v", 3, torch.device("cpu")))
    assert torch.equal(masks[0], again)  # reproducible from (seed, channel, t)


def test_soteria_with_identity_compressor_is_averaged_noisy_sgd():
    """s = mean_i s_i makes s + mean_i C(g_i - s_i) = mean_i g_i when C = id (any gamma_s)."""
    task = Quadratic()
    comm, _ = _comm()
    eta, sigma, seed = 0.05, 0.3, 2
    alg = SoteriaFL(StepSize(eta), 0.37, Identity(), ClipSpec("batch_mean", 1.5, "hard"), sigma)
    state = alg.init(_x0(), task.oracle, comm, keys=Keys.from_seed(seed))
    keys = node_noise_keys(range(N), seed=seed)
    x = _x0()["x"][0].clone()
    for t in range(20):
        state, info = alg.step(state, task.oracle, comm)
        g = task.grad(x.expand(N, -1), t)
        g = g * torch.clamp(1.5 / g.norm(dim=1, keepdim=True), max=1.0)
        g = g + independent_noise(keys, t, D, sigma=sigma, dtype=torch.float64)
        x = x - eta * g.mean(0)
        torch.testing.assert_close(state.params["x"], x.expand(N, -1), rtol=0, atol=1e-12)
        torch.testing.assert_close(state.server_shift, state.shifts.mean(0), rtol=0, atol=1e-12)
    assert info["bits_per_node"] == Identity().bits(D)


def test_soteria_shift_invariant_with_compression():
    task, (comm, _) = Quadratic(), _comm()
    comp = RandomK(k=2)
    alg = SoteriaFL(StepSize(0.05), shift_step(omega=D / 2 - 1), comp, ClipSpec(), 0.1)
    state = alg.init(_x0(), task.oracle, comm, keys=Keys.from_seed(0))
    for _ in range(10):
        state, info = alg.step(state, task.oracle, comm)
        torch.testing.assert_close(state.server_shift, state.shifts.mean(0), rtol=0, atol=1e-12)
    assert info["bits_per_node"] == comp.bits(D)
    # the notebooks' shift step, closed form at omega = 3: sqrt(7 / (2 * 64))
    assert shift_step(omega=3.0) == pytest.approx(math.sqrt(7 / 128))


@pytest.mark.parametrize("rule", ["best-constant", "fdla"])
def test_mixing_matrices_and_lemma1(rule):
    """Definition 1: W = W^T, W 1 = 1, zero off the graph, alpha < 1, Lemma 1's bound."""
    topo = parse_graph("er:10:0.8:1")
    w = fdla_mixing(topo) if rule == "fdla" else best_constant_mixing(topo)
    a = w.dense()
    np.testing.assert_allclose(a, a.T, atol=1e-14)
    np.testing.assert_allclose(a.sum(1), 1.0, atol=1e-12)
    adj = topo.adjacency.toarray() + np.eye(10)
    assert np.all(a[adj == 0] == 0)
    alpha = mixing_rate(w)
    lam = np.sort(np.linalg.eigvalsh(a))
    assert alpha == pytest.approx(max(abs(lam[-2]), abs(lam[0])))  # closed form for symmetric W
    assert 0 <= alpha < 1
    for gamma in (0.05, 0.3, 1.0):
        hat = np.eye(10) + gamma * (a - np.eye(10))
        alpha_hat = np.linalg.norm(hat - np.full((10, 10), 0.1), 2)
        assert alpha_hat <= 1 - gamma * (1 - alpha) + 1e-12


def test_fdla_beats_best_constant_and_metropolis_weights():
    """FDLA minimises ||W - J||_2 over all symmetric edge weights, so it is at most the best
    constant weight's and Metropolis-Hastings' rates (Definition 1, Lemma 1); the best constant weight
    itself has the closed form (lambda_n - lambda_2)/(lambda_n + lambda_2) of the Laplacian."""
    from privdl.topology.mixing import mixing_matrix

    for spec in ("er:10:0.8:1", "er:12:0.4:3", "ring:8"):
        topo = parse_graph(spec)
        lam = np.linalg.eigvalsh(topo.laplacian.toarray())
        best_constant = mixing_rate(best_constant_mixing(topo))
        assert best_constant == pytest.approx((lam[-1] - lam[1]) / (lam[-1] + lam[1]))
        fdla = mixing_rate(fdla_mixing(topo, iterations=500))
        assert fdla <= best_constant + 1e-12
        assert fdla <= mixing_rate(mixing_matrix(topo, "metropolis")) + 1e-12
    # on a ring the best constant weight is already optimal (edge-transitive graph)
    ring = parse_graph("ring:8")
    assert mixing_rate(fdla_mixing(ring, iterations=500)) == pytest.approx(
        mixing_rate(best_constant_mixing(ring)), abs=1e-3
    )


def test_bad_options_raise_config_errors():
    with pytest.raises(ConfigError):
        beer(step_size=0.1, gamma=0.0, compressor=Identity())
    with pytest.raises(ConfigError):
        Porter(StepSize(0.1), 0.5, Identity(), ClipSpec(), -1.0)
    alg = beer(step_size=0.1, gamma=0.5, compressor=Identity())
    with pytest.raises(ConfigError):
        # agents must share x_bar^(0)
        alg.init({"x": torch.randn(3, 4)}, None, _comm(3)[0], keys=Keys.from_seed(0))
    with pytest.raises(ConfigError):
        shift_step(omega=-1.0)


class _Holding(LocalCommunicator):
    """The simulator's communicator as a process holding the agents ``held`` sees it at init."""

    def __init__(self, held: list[int]) -> None:
        super().__init__(_comm()[0].schedule, dtype=torch.float64)
        self._held = torch.tensor(held)

    @property
    def owned(self) -> torch.Tensor:
        return self._held

    def shard(self, tree):
        return {k: v[self._held] for k, v in tree.items()}


def test_init_for_held_nodes_derives_their_global_keys_and_noise():
    """Sharded init (a communicator holding some agents): keys/noise of agent i do not depend on
    which rows are held."""
    task = Quadratic()
    alg = porter_dp(step_size=0.05, gamma=0.3, compressor=Identity(), tau=1.0, sigma_p=0.7)
    full = alg.init(_x0(), task.oracle, _comm()[0], keys=Keys.from_seed(3))
    held = [1, 3, 4]
    part = alg.init({"x": _x0()["x"][held]}, None, _Holding(held), keys=Keys.from_seed(3))
    assert full.nodes == tuple(range(N)) and part.nodes == tuple(held)
    assert part.noise_keys == tuple(node_noise_keys(held, seed=3))
    assert part.noise_keys == tuple(full.noise_keys[i] for i in held)

    def oracle_rows(params, t, *, clip):  # the task's oracle restricted to the held agents
        res = task.oracle({"x": _x0()["x"]}, t, clip=clip)
        return GradResult({"x": res.grads["x"][held]}, res.loss[held])

    g_full, _ = alg.gradients(full, task.oracle, _comm()[0])
    g_part, _ = alg.gradients(part, oracle_rows, _comm()[0])
    torch.testing.assert_close(g_part, g_full[held], rtol=0, atol=0)
    with pytest.raises(ConfigError, match="3 rows but the communicator owns 2 nodes"):
        alg.init({"x": _x0()["x"][held]}, None, _Holding([0, 1]), keys=Keys.from_seed(3))
    with pytest.raises(ConfigError, match="noise keys"):  # keys of 3 agents, gradients of 5
        alg.gradients(part, lambda p, t, *, clip: task.oracle(_x0(), t, clip=clip), _comm()[0])


class _SpyCompressor:
    """RandomK that records the generator state of each call (which channel drew the mask)."""

    def __init__(self, k: int) -> None:
        self.inner, self.states = RandomK(k=k), []

    def __call__(self, x: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
        self.states.append(generator.get_state().clone())
        return self.inner(x, generator=generator)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_step_compresses_v_and_x_on_their_own_channels():
    """(11) and (13) compress v and x with independent masks: channel "v" then "x" of
    (seed, t), as ``channel_generator`` rebuilds them (one channel for both would pass every
    other test: the same masks on both messages)."""
    task, (comm, _) = Quadratic(), _comm()
    spy = _SpyCompressor(k=3)
    alg = porter_dp(step_size=0.05, gamma=0.2, compressor=spy, tau=1.0, sigma_p=0.1)
    state = alg.init(_x0(), task.oracle, comm, keys=Keys.from_seed(6))
    for _ in range(3):
        state, _ = alg.step(state, task.oracle, comm)
    cpu = torch.device("cpu")
    expected = [channel_generator(6, ch, t, cpu).get_state() for t in range(3) for ch in ("v", "x")]
    assert len(spy.states) == 6
    for got, want in zip(spy.states, expected, strict=True):
        assert torch.equal(got, want)
    assert not torch.equal(expected[0], expected[1])


def test_one_agent_porter_gc_is_sgd_on_the_clipped_minibatch_mean():
    """Option II (PORTER-GC): the minibatch MEAN gradient is clipped, once; no noise. n = 1 with
    the identity compressor: x <- x - eta Clip_tau(mean_s grad l(x; z_s)); autograd loop oracle."""
    g = torch.Generator().manual_seed(0)
    feats = (torch.rand(1, 40, 6, generator=g) < 0.4).to(torch.float64) * 3
    labels = torch.where(torch.rand(1, 40, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    task = NonconvexLogisticTask(feats, labels, feats[0], labels[0], lam=0.2, batch_size=4, seed=2)
    comm = LocalCommunicator(MixingMatrix("one", sp.csr_matrix([[1.0]])))
    tau, eta = 0.3, 0.3
    alg = porter_gc(step_size=eta, gamma=0.5, compressor=Identity(), tau=tau)
    assert alg.clip.mode == "batch_mean" and alg.sigma_p == 0
    state = alg.init(task.init_params(seed=1), task.oracle, comm, keys=Keys.from_seed(9))
    x = task.init_params(seed=1)["x"][0].clone()
    for t in range(10):
        state, _ = alg.step(state, task.oracle, comm)
        idx = _batch_index(torch.tensor([40]), 4, 2, t)[0]
        total = torch.zeros_like(x)
        for s in idx.tolist():  # slow one-sample loop, then one clip of the mean
            xs = x.clone().requires_grad_(True)
            loss = torch.log1p(torch.exp(-labels[0, s] * (feats[0, s] @ xs)))
            loss = loss + 0.2 * (xs**2 / (1 + xs**2)).sum()
            (gs,) = torch.autograd.grad(loss, xs)
            total += gs
        mean = total / 4
        x = x - eta * tau / (tau + mean.norm()) * mean
        torch.testing.assert_close(state.params["x"][0], x, rtol=0, atol=1e-12)
