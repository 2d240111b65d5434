"""Flower's Message API (privdl.integrations.flower_app): the strategy's weights are privdl's
aggregators', the DP client is privdl's calibrated DP-SGD with labelled epsilons, and the example
app runs in Flower's simulation engine (slow; skipped without flwr and ray)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from privdl.accounting.clients import client_noise_multipliers
from privdl.algorithms.aggregators import AggregationInput, RobustHDP, build_aggregator
from privdl.errors import ConfigError, PrivacyError
from privdl.integrations.flower_app import DPClient, aggregate_arrays, make_aggregator
from privdl.models import build_model

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {"w": (30, 20), "b": (400,), "v": (5, 8)}  # p = 1040
RPCA = {"max_iter": 3000}


def _problem(stds, *, seed=0):
    rng = np.random.default_rng(seed)
    p = sum(int(np.prod(s)) for s in SHAPES.values())
    theta = rng.normal(size=p).astype(np.float32)
    basis = rng.normal(size=(p, 2)) / np.sqrt(p)
    deltas = basis @ rng.normal(size=(2, len(stds))) + rng.normal(size=(p, len(stds))) * stds
    clients = (theta[:, None] + deltas).astype(np.float32)

    def split(v):
        out, start = {}, 0
        for k, s in SHAPES.items():
            size = int(np.prod(s))
            out[k] = v[start : start + size].reshape(s)
            start += size
        return out

    return split(theta), [split(clients[:, i]) for i in range(len(stds))], theta, clients


def _privdl_weights(aggregator, theta, clients, **extra):
    m = torch.from_numpy(clients.astype(np.float64) - theta.astype(np.float64)[:, None])
    k = m.shape[1]
    res = aggregator(
        AggregationInput(
            updates=m,
            clients=torch.arange(k),
            round_index=0,
            reported_eps=torch.as_tensor(extra.get("eps", np.ones(k)), dtype=torch.float64),
            num_samples=torch.as_tensor(extra.get("n", np.ones(k)), dtype=torch.float64),
        )
    )
    return res.weights.double().numpy(), m.numpy()


@pytest.mark.parametrize("name", ["robust-hdp", "dpfedavg", "weiavg", "mineps", "pfa"])
def test_aggregate_arrays_equals_privdl_aggregator(name) -> None:
    stds = np.array([0.01, 0.02, 0.04, 0.08, 0.16])
    g, cs, theta, clients = _problem(stds)
    opts = RPCA if name == "robust-hdp" else {}
    eps, n = np.array([8.0, 4.0, 2.0, 1.0, 0.5]), np.array([100, 200, 300, 400, 500])
    out = aggregate_arrays(
        g, cs, aggregator=build_aggregator(name, **opts), client_ids=range(5), round_index=0,
        num_examples=n, reported_epsilons=eps,
    )  # fmt: skip
    w_ref, m = _privdl_weights(build_aggregator(name, **opts), theta, clients, eps=eps, n=n)
    np.testing.assert_allclose(out.weights, w_ref, rtol=1e-12)
    assert list(out.arrays) == list(SHAPES) and all(
        a.dtype == np.float32 for a in out.arrays.values()
    )
    if name != "pfa":  # PFA projects the private clients' updates first
        flat = np.concatenate([out.arrays[k].ravel() for k in SHAPES])
        np.testing.assert_allclose(flat, theta + m @ w_ref, atol=1e-6)
    if name == "robust-hdp":
        assert np.all(np.diff(out.weights) < 0)  # more noise, less weight


def test_aggregate_arrays_refusals() -> None:
    g, cs, _, clients = _problem(np.array([0.1, 0.2]))
    with pytest.raises(ConfigError, match="oracle"):
        make_aggregator("oracle")
    with pytest.raises(ConfigError, match="reports"):
        aggregate_arrays(g, cs, aggregator=make_aggregator("weiavg"), client_ids=[0, 1],
                         round_index=0, num_examples=[1, 1])  # fmt: skip
    bad = [dict(cs[0], w=cs[0]["w"][:2])]
    with pytest.raises(ConfigError, match="shapes"):
        aggregate_arrays(g, bad, aggregator=RobustHDP(), client_ids=[0], round_index=0,
                         num_examples=[1])  # fmt: skip
    one = aggregate_arrays(g, cs[:1], aggregator=RobustHDP(), client_ids=[0], round_index=0,
                           num_examples=[1])  # fmt: skip
    assert one.weights.tolist() == [1.0]


def _client(**kw):
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(200, 6)), dtype=torch.float32)
    y = torch.as_tensor((x[:, 0] > 0).numpy().astype(np.int64))
    opts = dict(epsilon=2.0, delta=1e-5, clip=1.0, lr=0.5, batch_size=20, rounds=2,
                calibration="rdp", accountant="rdp")  # fmt: skip
    opts.update(kw)
    return DPClient(build_model("linear", in_shape=(6,), n_classes=2), x, y, **opts)


def test_dp_client_calibrates_accounts_and_refuses_extra_rounds() -> None:
    c = _client()
    assert c.local_steps == 10 and c.sampling_rate == pytest.approx(0.1)
    z = client_noise_multipliers(
        np.array([2.0]), batch_sizes=np.array([20.0]), num_samples=np.array([200]),
        local_steps=np.array([10]), local_epochs=1, rounds=2, delta=1e-5, calibration="rdp",
    )[0]  # fmt: skip
    assert c.noise_multiplier == z
    params = {k: v[0].numpy() for k, v in c.model.init(
        n_nodes=1, generator=torch.Generator().manual_seed(0)).items()}  # fmt: skip
    new, b1 = c.train(params, rounds_spent=0, seed=1)
    again, _ = c.train(params, rounds_spent=0, seed=1)
    assert all(np.array_equal(new[k], again[k]) for k in new)  # seeded: reproducible
    assert any(not np.allclose(new[k], params[k]) for k in new)
    _, b2 = c.train(new, rounds_spent=1, seed=2)
    for b in (b1, b2):
        assert b["accountant"] == "rdp" and b["delta"] == 1e-5 and b["unit"] == "example"
        assert b["neighbouring"] == "add_remove" and b["threat_model"] == "server"
        assert b["nominal"] is False
    assert 0 < b1["epsilon"] < b2["epsilon"] <= 2.0
    assert b2["epsilon"] > 1.9  # the calibration is tight over both rounds
    with pytest.raises(PrivacyError, match="calibrated for 2 rounds"):
        c.train(new, rounds_spent=2)
    with pytest.raises(ConfigError, match="arrays"):
        c.train({"nope": np.zeros(3)}, rounds_spent=0)
    assert set(c.evaluate(new)) == {"loss", "accuracy"}


def _reply(node, arrays, metrics, privacy=None):
    from flwr.app import (
        Array,
        ArrayRecord,
        ConfigRecord,
        Message,
        Metadata,
        MetricRecord,
        RecordDict,
    )

    content = {
        "arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}),
        "metrics": MetricRecord(metrics),
    }
    if privacy is not None:
        content["privacy"] = ConfigRecord(privacy)
    meta = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0,
                    reply_to_message_id="x", group_id="1", created_at=time.time(), ttl=60.0,
                    message_type="train")  # fmt: skip
    return Message(RecordDict(content), metadata=meta)


def test_strategy_weights_equal_robust_hdp_aggregator() -> None:
    pytest.importorskip("flwr")
    from flwr.app import Array, ArrayRecord
    from flwr.serverapp.strategy import FedAvg

    from privdl.integrations.flower_app import HDPStrategy

    stds = np.array([0.02, 0.04, 0.08, 0.16])
    g, cs, theta, clients = _problem(stds, seed=1)
    strategy = HDPStrategy(aggregator_options=RPCA, min_available_nodes=4)
    assert isinstance(strategy, FedAvg)
    # what configure_train would record as theta^e (configure_train needs a Grid)
    strategy.current_arrays = {k: ArrayRecord({k: Array(v)})[k].numpy() for k, v in g.items()}
    nodes = [40, 10, 30, 20]  # replies arrive in any order; the strategy sorts by node id
    label = {"epsilon": 1.5, "delta": 1e-5, "accountant": "pld", "neighbouring": "add_remove",
             "unit": "example", "threat-model": "server", "nominal": False, "notes": ""}  # fmt: skip
    replies = [
        _reply(nodes[i], cs[i], {"num-examples": 100, "epsilon-target": 2.0}, label)
        for i in range(4)
    ]
    arrays, metrics = strategy.aggregate_train(1, replies[::-1])
    order = np.argsort(nodes)
    w_ref, m = _privdl_weights(RobustHDP(**RPCA), theta, clients[:, order])
    entry = strategy.history[-1]
    assert entry["nodes"] == sorted(nodes)
    np.testing.assert_allclose(entry["weights"], w_ref, rtol=1e-12)
    np.testing.assert_allclose([metrics[f"weight/{n}"] for n in sorted(nodes)], w_ref, rtol=1e-12)
    got = np.concatenate([arrays[k].numpy().ravel() for k in SHAPES])
    np.testing.assert_allclose(got, theta + m @ w_ref, atol=1e-6)
    assert metrics["epsilon-max"] == 1.5 and entry["privacy"][0]["accountant"] == "pld"


def test_missing_flwr_is_a_one_line_config_error(monkeypatch) -> None:
    import privdl.integrations.flower_app as fa

    monkeypatch.setitem(sys.modules, "flwr", None)
    monkeypatch.delitem(fa.__dict__, "HDPStrategy", raising=False)
    with pytest.raises(ConfigError, match=r'pip install "privdl\[flower\]"'):
        fa.HDPStrategy  # noqa: B018
    with pytest.raises(ConfigError, match=r'pip install "privdl\[flower\]"'):
        fa.dp_client_app(lambda c: None)


@pytest.mark.slow
def test_example_app_in_flower_simulation(monkeypatch) -> None:
    """The example (4 clients, epsilons 1, 2, 4, 8) for 2 rounds in Flower's simulation engine:
    every client reports its labelled epsilon, within its target after the last round; the
    weights equal privdl's RobustHDP on the same updates, and fall with the noise."""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    examples = str(ROOT / "examples")
    monkeypatch.syspath_prepend(examples)
    # the Ray workers that run the ClientApps import the example too
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([examples, os.environ.get("PYTHONPATH", "")]))
    from flower_robust_hdp.app import EPSILONS, report, run

    from privdl.integrations.flower_app import SEEDED_NOTE

    start = time.perf_counter()
    strategy = run(rounds=2, seed=0)
    elapsed = time.perf_counter() - start
    print(report(strategy), f"\n{elapsed:.1f} s")
    assert [e["round"] for e in strategy.history] == [1, 2]
    replay = RobustHDP(reestimate_every=1, max_iter=2000)
    for entry in strategy.history:
        assert len(entry["nodes"]) == 4
        targets = [m["epsilon-target"] for m in entry["metrics"]]
        assert sorted(targets) == sorted(EPSILONS)
        for p, m, target in zip(entry["privacy"], entry["metrics"], targets, strict=True):
            assert p["accountant"] in ("pld", "rdp") and p["delta"] == 1e-5
            assert (p["neighbouring"], p["unit"], p["threat-model"]) == (
                "add_remove", "example", "server",
            )  # fmt: skip
            assert p["nominal"] is False and m["epsilon"] == p["epsilon"]
            assert p["notes"].endswith(SEEDED_NOTE)  # run(seed=0): who can rebuild the noise
            assert 0 < p["epsilon"] <= target * (1 + 1e-9)
            assert m["rounds-spent"] == entry["round"]
        ids = [strategy.client_index[n] for n in entry["nodes"]]
        res = replay(
            AggregationInput(
                updates=torch.from_numpy(entry["updates"]),
                clients=torch.as_tensor(ids),
                round_index=entry["round"] - 1,
                reported_eps=torch.ones(4, dtype=torch.float64),
                num_samples=torch.full((4,), 500.0, dtype=torch.float64),
            )
        )
        np.testing.assert_allclose(entry["weights"], res.weights.numpy(), rtol=1e-10)
        w = dict(zip(targets, entry["weights"], strict=True))
        assert w[8.0] > w[1.0]  # the least private client's update is the least noisy
    last = strategy.history[-1]
    for p, m in zip(last["privacy"], last["metrics"], strict=True):
        assert p["epsilon"] > 0.9 * m["epsilon-target"]  # calibrated over exactly 2 rounds
