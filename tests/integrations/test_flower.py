"""Robust-HDP as a Flower strategy: aggregation equals theta + sum_i w_i Delta_i."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from privdl.algorithms.aggregators import RobustHDP
from privdl.errors import ConfigError
from privdl.robust import estimate_noise_levels, inverse_variance_weights

SHAPES = [(30, 20), (400,), (5, 8)]  # p = 1040 parameters in three arrays
RPCA = {"max_iter": 3000}


def _problem(stds, *, seed=0, rank=2):
    """Global arrays and client arrays with Delta_i = low-rank signal + N(0, std_i^2) noise."""
    rng = np.random.default_rng(seed)
    p = sum(int(np.prod(s)) for s in SHAPES)
    theta = rng.normal(size=p).astype(np.float32)
    basis = rng.normal(size=(p, rank)) / np.sqrt(p)
    signal = basis @ rng.normal(size=(rank, len(stds)))
    deltas = signal + rng.normal(size=(p, len(stds))) * np.asarray(stds)[None, :]
    clients = (theta[:, None] + deltas).astype(np.float32)

    def split(v):
        out, start = [], 0
        for s in SHAPES:
            size = int(np.prod(s))
            out.append(v[start : start + size].reshape(s))
            start += size
        return out

    return split(theta), [split(clients[:, i]) for i in range(len(stds))], theta, clients


def _expected(theta, clients):
    """Independent path: the (p, k) matrix from the float32 arrays, our estimator, Eq. 8."""
    m = torch.from_numpy(clients.astype(np.float64) - theta.astype(np.float64)[:, None])
    w = inverse_variance_weights(estimate_noise_levels(m, **RPCA)).numpy()
    return theta.astype(np.float64) + m.numpy() @ w, w


def test_aggregate_matches_weighted_sum_of_updates() -> None:
    from privdl.integrations.flower import robust_hdp_aggregate

    stds = [0.01, 0.02, 0.04, 0.08, 0.16]
    g, cs, theta, clients = _problem(stds)
    new, w, s2 = robust_hdp_aggregate(
        g, cs, aggregator=RobustHDP(**RPCA), client_ids=range(5), round_index=0
    )
    want, w_ref = _expected(theta, clients)
    np.testing.assert_allclose(w, w_ref, rtol=1e-10)
    np.testing.assert_allclose(np.concatenate([a.ravel() for a in new]), want, atol=1e-6)
    assert [a.shape for a in new] == SHAPES and all(a.dtype == np.float32 for a in new)
    # noisier clients get smaller weights (the exact ratios are RPCA's, not 1/std^2: with 5
    # columns the low-rank part absorbs part of the noisiest updates)
    assert np.all(np.diff(w) < 0)
    assert np.all(np.isfinite(s2))


def test_equal_noise_gives_uniform_weights() -> None:
    from privdl.integrations.flower import robust_hdp_aggregate

    g, cs, _, _ = _problem([0.05] * 6, seed=3)
    _, w, _ = robust_hdp_aggregate(
        g, cs, aggregator=RobustHDP(**RPCA), client_ids=range(6), round_index=0
    )
    np.testing.assert_allclose(w, np.full(6, 1 / 6), rtol=0.15)


def test_shape_mismatch_and_single_client() -> None:
    from privdl.integrations.flower import robust_hdp_aggregate

    g, cs, theta, clients = _problem([0.1, 0.2])
    with pytest.raises(ConfigError, match="shapes"):
        robust_hdp_aggregate(g, [cs[0][:2]], aggregator=RobustHDP(), client_ids=[0], round_index=0)
    new, w, _ = robust_hdp_aggregate(
        g, cs[:1], aggregator=RobustHDP(), client_ids=[0], round_index=0
    )
    assert w.tolist() == [1.0]
    np.testing.assert_allclose(np.concatenate([a.ravel() for a in new]), clients[:, 0])


def test_missing_flwr_is_a_one_line_config_error(monkeypatch) -> None:
    import privdl.integrations.flower as fl

    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr -> ImportError
    monkeypatch.delitem(fl.__dict__, "RobustHDPStrategy", raising=False)
    with pytest.raises(ConfigError, match=r'pip install "privdl\[flower\]"') as e:
        fl.RobustHDPStrategy  # noqa: B018
    assert "\n" not in str(e.value)


def _fit_results(client_arrays, names, num_examples=100):
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    ok = Status(code=Code.OK, message="")
    return [
        (SimpleNamespace(cid=name), FitRes(ok, ndarrays_to_parameters(arr), num_examples, {}))
        for name, arr in zip(names, client_arrays, strict=True)
    ]


def test_strategy_aggregate_fit() -> None:
    pytest.importorskip("flwr")
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg

    from privdl.integrations.flower import RobustHDPStrategy

    stds = [0.02, 0.04, 0.08, 0.16]
    g, cs, theta, clients = _problem(stds, seed=1)
    strategy = RobustHDPStrategy(
        initial_parameters=ndarrays_to_parameters(g), estimate_kwargs=RPCA, reestimate_every=1
    )
    assert isinstance(strategy, FedAvg)
    assert strategy.initialize_parameters(client_manager=None) is not None
    names = ["a", "b", "c", "d"]
    params, metrics = strategy.aggregate_fit(1, _fit_results(cs, names), [])
    want, w_ref = _expected(theta, clients)
    got = np.concatenate([a.ravel() for a in parameters_to_ndarrays(params)])
    np.testing.assert_allclose(got, want, atol=1e-6)
    w = np.array([metrics[f"weight/{n}"] for n in names])
    np.testing.assert_allclose(w, w_ref, rtol=1e-10)
    assert metrics["rpca_estimated"] is True
    # round 2: Delta is taken against the new global model (the strategy tracks theta^e)
    cs2 = [
        [a + (b - c) for a, b, c in zip(arr, parameters_to_ndarrays(params), g, strict=True)]
        for arr in cs
    ]
    params2, metrics2 = strategy.aggregate_fit(2, _fit_results(cs2, names), [])
    got2 = np.concatenate([a.ravel() for a in parameters_to_ndarrays(params2)])
    w2 = np.array([metrics2[f"weight/{n}"] for n in names])
    delta2 = clients - theta[:, None]  # same updates as round 1, on top of the new global
    np.testing.assert_allclose(got2, got + delta2 @ w2, atol=2e-5)


def test_strategy_needs_global_parameters() -> None:
    pytest.importorskip("flwr")
    from privdl.integrations.flower import RobustHDPStrategy

    _, cs, _, _ = _problem([0.1, 0.2])
    with pytest.raises(ConfigError, match="global parameters"):
        RobustHDPStrategy().aggregate_fit(1, _fit_results(cs, ["a", "b"]), [])
    assert RobustHDPStrategy().aggregate_fit(1, [], []) == (None, {})


def test_legacy_strategy_is_deprecated() -> None:
    pytest.importorskip("flwr")
    from privdl.integrations.flower import RobustHDPStrategy

    with pytest.warns(DeprecationWarning, match="flower_app.HDPStrategy"):
        RobustHDPStrategy()
