"""Federated DP-SGD rounds and server aggregators (Robust-HDP Algorithm 1 and its baselines)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from privdl.accounting.nominal import robust_hdp_epsilon
from privdl.algorithms.aggregators import (
    AggregationInput,
    build_aggregator,
    two_means_split,
)
from privdl.algorithms.federated import evaluate_clients, flatten_tree, split_train_test
from privdl.data.batching import stack_partitions
from privdl.errors import ConfigError, PrivacyError
from privdl.models import build_model
from privdl.robust import RPCANotConvergedWarning
from privdl.robust.table3 import update_variance
from privdl.robust.trainer import FederatedConfig, FederatedDPSGD


def _data(counts, *, d=6, classes=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    total = sum(counts)
    x = torch.randn(total, d, generator=g, dtype=dtype)
    y = torch.randint(0, classes, (total,), generator=g)
    parts = np.split(np.arange(total), np.cumsum(counts)[:-1])
    return x, y, stack_partitions(x, y, parts)


def _trainer(counts, cfg, agg="dpfedavg", *, d=6, classes=3, **agg_kw):
    x, y, data = _data(counts, d=d, classes=classes)
    model = build_model("linear", in_shape=(d,), n_classes=classes)
    fl = FederatedDPSGD(model, data, config=cfg, aggregator=build_aggregator(agg, **agg_kw))
    params = model.init(n_nodes=1, generator=torch.Generator().manual_seed(3), dtype=x.dtype)
    return fl, model, params, x, y, data


def test_vectorised_round_equals_per_client_loop() -> None:
    """One private round with heterogeneous N_i, b_i, eps_i == a one-sample-at-a-time loop that
    replays the documented random draws (Poisson rand, then randn per parameter)."""
    counts, b, eps = [40, 30, 50], (4, 8, 5), (1.0, 2.0, 4.0)
    cfg = FederatedConfig(batch_sizes=b, lr=0.1, rounds=2, epsilons=eps, clip_norm=0.5)
    fl, model, params, x, y, data = _trainer(counts, cfg)
    state = fl.init(params, seed=11)
    new, info = fl.step(state)

    gen = torch.Generator().manual_seed(11)
    theta = {k: v[0].clone() for k, v in params.items()}
    local = [{k: v.clone() for k, v in theta.items()} for _ in counts]
    steps = [math.ceil(m / bb) for m, bb in zip(counts, b, strict=True)]
    assert list(fl.local_steps) == steps
    z = fl.noise_multipliers
    width = max(counts)
    for k in range(max(steps)):
        u = torch.rand(3, width, generator=gen)
        noise = {
            name: torch.randn((3, *v.shape), generator=gen, dtype=v.dtype)
            for name, v in theta.items()
        }
        for i in range(3):
            if k >= steps[i]:
                continue
            start = sum(counts[:i])
            total = {name: torch.zeros_like(v) for name, v in theta.items()}
            for j in range(counts[i]):
                if not float(u[i, j]) < b[i] / counts[i]:
                    continue
                w = local[i]["fc.weight"].clone().requires_grad_(True)
                bias = local[i]["fc.bias"].clone().requires_grad_(True)
                loss = F.cross_entropy((x[start + j] @ w.T + bias)[None], y[start + j][None])
                gw, gb = torch.autograd.grad(loss, [w, bias])
                norm = torch.sqrt(gw.pow(2).sum() + gb.pow(2).sum())
                scale = min(1.0, 0.5 / float(norm))
                total["fc.weight"] += scale * gw
                total["fc.bias"] += scale * gb
            for name in local[i]:
                g = (total[name] + 0.5 * z[i] * noise[name][i]) / b[i]
                local[i][name] = local[i][name] - 0.1 * g
    sizes = torch.tensor(counts, dtype=torch.float64) / sum(counts)
    expected = {k: sum(sizes[i] * local[i][k] for i in range(3)) for k in theta}
    for k in theta:
        torch.testing.assert_close(new.theta[k], expected[k], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(info["weights"], sizes)


def test_fedavg_one_full_step_is_sgd_on_the_union() -> None:
    """Non-private FedAvg, one full-batch local step, w ∝ N_i == one GD step on all the data."""
    counts = [7, 12, 5, 9]
    cfg = FederatedConfig(batch_sizes=(1,) * 4, lr=0.3, rounds=1, sampling="full")
    fl, model, params, x, y, data = _trainer(counts, cfg, agg="fedavg")
    new, _ = fl.step(fl.init(params, seed=0))
    w = params["fc.weight"][0].clone().requires_grad_(True)
    bias = params["fc.bias"][0].clone().requires_grad_(True)
    gw, gb = torch.autograd.grad(F.cross_entropy(x @ w.T + bias, y), [w, bias])
    torch.testing.assert_close(new.theta["fc.weight"], w.detach() - 0.3 * gw)
    torch.testing.assert_close(new.theta["fc.bias"], bias.detach() - 0.3 * gb)


def _noisy_trainer(eps, b, agg, *, n_per=64, **agg_kw):
    n = len(eps)
    cfg = FederatedConfig(batch_sizes=tuple(b), lr=0.01, rounds=5, epsilons=tuple(eps))
    return _trainer([n_per] * n, cfg, agg, d=200, classes=10, **agg_kw)


def test_equal_noise_gives_uniform_robust_hdp_weights() -> None:
    """Equal noise end to end (Robust-HDP Eq. 8): same eps, b, N for all clients -> RPCA weights within 0.01 of 1/n."""
    fl, _m, params, *_ = _noisy_trainer([1.0] * 8, [8] * 8, "robust-hdp", max_iter=3000)
    _, info = fl.step(fl.init(params, seed=5))
    w = info["weights"].numpy()
    assert np.abs(w - 1 / 8).max() <= 0.01, w
    assert w.sum() == pytest.approx(1.0)


def test_oracle_weights_inverse_variance_and_eq7_matches_measured_noise() -> None:
    """Oracle weights == (1/s)/sum(1/s) with s from Table 3's Eq. 7 closed form; and the measured
    ||Delta_i||^2 matches Eq. 7 sigma_i^2 when the DP noise dominates (p = 2010)."""
    eps, b = [0.5, 1.0, 2.0, 4.0, 1.0, 0.5], [4, 8, 16, 8, 4, 16]
    fl, model, params, *_ = _noisy_trainer(eps, b, "oracle")
    s = update_variance(fl.noise_multipliers, b, num_samples=64, clip_norm=3.0)
    s = s * model.num_parameters() * 0.01**2
    np.testing.assert_allclose(fl.true_update_variance(), s, rtol=1e-12)
    state = fl.init(params, seed=2)
    _, info = fl.step(state)
    np.testing.assert_allclose(info["weights"].numpy(), (1 / s) / (1 / s).sum(), rtol=1e-12)
    deltas = fl.local_updates(state.theta, torch.ones(6, dtype=torch.bool), state.generator)
    ratio = flatten_tree(deltas).pow(2).sum(1).numpy() / s
    assert np.all((ratio > 0.9) & (ratio < 1.15)), ratio


def test_robust_hdp_ignores_reported_eps_weiavg_does_not() -> None:
    """Robust-HDP Fig 5 right (Section 4.2, RQ3): a falsified eps leaves Robust-HDP and DPFedAvg weights bit-identical; WeiAvg
    follows it."""
    eps, b = [1.0, 2.0, 0.5, 1.0], [8, 8, 8, 16]
    out = {}
    for rep in (None, (1.0, 2.0, 0.5, 20.0)):
        for agg in ("robust-hdp", "weiavg", "dpfedavg"):
            kw = {"max_iter": 100} if agg == "robust-hdp" else {}
            cfg = FederatedConfig(
                batch_sizes=tuple(b), lr=0.01, rounds=3, epsilons=tuple(eps), reported_epsilons=rep
            )
            fl, _m, params, *_ = _trainer([64] * 4, cfg, agg, d=50, classes=4, **kw)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RPCANotConvergedWarning)
                out[(rep is None, agg)] = fl.step(fl.init(params, seed=1))[1]["weights"]
    assert torch.equal(out[(True, "robust-hdp")], out[(False, "robust-hdp")])
    assert torch.equal(out[(True, "dpfedavg")], out[(False, "dpfedavg")])
    assert float(out[(False, "weiavg")][3]) == pytest.approx(20.0 / (20.0 + 3.5))
    assert float(out[(True, "weiavg")][3]) == pytest.approx(1.0 / 4.5)


def test_partial_participation_and_budgets() -> None:
    cfg = FederatedConfig(
        batch_sizes=(8,) * 5,
        lr=0.05,
        rounds=4,
        epsilons=(1.0,) * 5,
        clients_per_round=2,
        calibration="reference",
    )
    fl, _m, params, *_ = _trainer([40] * 5, cfg, "weiavg")
    state = fl.init(params, seed=0)
    for _ in range(3):
        before = {k: v.clone() for k, v in state.theta.items()}
        state, info = fl.step(state)
        w = info["weights"]
        assert int((w > 0).sum()) == 2 and float(w.sum()) == pytest.approx(1.0)
        assert not torch.equal(before["fc.weight"], state.theta["fc.weight"])
    assert int(state.participated.sum()) == 6
    budgets = fl.client_budgets(state.participated)
    full = fl.client_budgets()
    for part, done, whole in zip(state.participated.tolist(), budgets, full, strict=True):
        assert done["nominal"]["nominal"]
        assert (done["accounted"] is None) == (part == 0)
        assert whole["accounted"]["threat_model"] == "server"
        # post-processing: the code's accountant gives the target (up to z rounding); dp-accounting's RDP
        # (more orders, tighter conversion) certifies no more than that for the same z
        code = robust_hdp_epsilon(
            whole["noise_multiplier"], batch_size=8, dataset_size=40, delta=1e-4, rounds=4
        )
        assert code == pytest.approx(1.0, abs=0.02)
        assert 0.5 < whole["accounted"]["epsilon"] <= code
        if part:
            assert done["accounted"]["epsilon"] < whole["accounted"]["epsilon"]


def test_mineps_uses_smallest_eps_noise() -> None:
    cfg = FederatedConfig(batch_sizes=(8, 8, 8), lr=0.1, rounds=3, epsilons=(0.5, 1.0, 3.0))
    a, *_ = _trainer([40] * 3, cfg, "mineps")
    b, *_ = _trainer([40] * 3, cfg, "dpfedavg")
    assert np.all(a.noise_multipliers == b.noise_multipliers[0])
    assert b.noise_multipliers[0] > b.noise_multipliers[1] > b.noise_multipliers[2]


def test_two_means_split_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = rng.exponential(size=int(rng.integers(2, 9)))
        best, mask_best = np.inf, None
        s = np.sort(v)
        for cut in range(1, v.size):
            cost = ((s[:cut] - s[:cut].mean()) ** 2).sum() + ((s[cut:] - s[cut:].mean()) ** 2).sum()
            if cost < best:
                best, mask_best = cost, v >= s[cut]
        np.testing.assert_array_equal(two_means_split(v), mask_best)


def test_pfa_projects_private_updates_on_public_subspace() -> None:
    g = torch.Generator().manual_seed(0)
    upd = torch.randn(30, 5, generator=g, dtype=torch.float64)
    eps = torch.tensor([5.0, 4.8, 5.2, 0.2, 0.3], dtype=torch.float64)
    res = build_aggregator("pfa")(
        AggregationInput(upd, torch.arange(5), 0, eps, torch.full((5,), 10.0))
    )
    pub = upd[:, :3]
    mean = pub.mean(1, keepdim=True)
    u = torch.linalg.svd(pub - mean, full_matrices=False)[0][:, :1]
    for j in (3, 4):
        resid = res.updates[:, j : j + 1] - mean
        torch.testing.assert_close(u @ (u.T @ resid), resid)  # lies on mean + span(u)
    torch.testing.assert_close(res.updates[:, :3], pub)
    torch.testing.assert_close(res.weights, eps / eps.sum())


def test_evaluate_clients_matches_loop_and_split() -> None:
    cfg = FederatedConfig(batch_sizes=(2, 2), lr=0.1, rounds=1, sampling="full")
    fl, model, params, x, y, data = _trainer([5, 9], cfg, "fedavg")
    theta = {k: v[0] for k, v in params.items()}
    res = evaluate_clients(model, theta, data)
    for i, (s, m) in enumerate([(0, 5), (5, 9)]):
        logits = x[s : s + m] @ theta["fc.weight"].T + theta["fc.bias"]
        acc = (logits.argmax(1) == y[s : s + m]).double().mean()
        assert float(res["accuracy"][i]) == pytest.approx(float(acc))
        loss = F.cross_entropy(logits, y[s : s + m])
        assert float(res["loss"][i]) == pytest.approx(float(loss))
    tr, te = split_train_test([np.arange(10), np.arange(10, 15)])
    assert [len(t) for t in tr] == [8, 4] and np.array_equal(te[0], [8, 9])


def test_bad_config() -> None:
    with pytest.raises(PrivacyError):
        FederatedConfig(batch_sizes=(8,), lr=0.1, rounds=1, epsilons=(0.0,))
    with pytest.raises(ConfigError):
        FederatedConfig(batch_sizes=(8, 8), lr=0.1, rounds=1, clients_per_round=3)
    with pytest.raises(PrivacyError):
        FederatedConfig(batch_sizes=(8,), lr=0.1, rounds=1, epsilons=(1.0,), sampling="full")
    with pytest.raises(ConfigError):
        build_aggregator("nope")


def _round_on(device: str, cfg: FederatedConfig, agg: str, **agg_kw):
    """One round with the data and the params on ``device``; returns (fl, state, info, eval)."""
    counts = [30, 40, 35, 45]
    _x, _y, data = _data(counts, d=5, classes=3)
    dev = torch.device(device)
    data = type(data)(data.x.to(dev), data.y.to(dev), data.counts.to(dev))
    model = build_model("linear", in_shape=(5,), n_classes=3)
    fl = FederatedDPSGD(model, data, config=cfg, aggregator=build_aggregator(agg, **agg_kw))
    params = model.init(n_nodes=1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    state = fl.init({k: v.to(dev) for k, v in params.items()}, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RPCANotConvergedWarning)
        new, info = fl.step(state)
    return fl, new, info, evaluate_clients(model, new.theta, data)


_PRIVATE = FederatedConfig(batch_sizes=(5, 6, 4, 8), lr=0.1, rounds=2, epsilons=(1, 2, 4, 8))
_DETERMINISTIC = FederatedConfig(batch_sizes=(1,) * 4, lr=0.3, rounds=1, sampling="full")


def _check_devices(device: str, fl, new, info, ev) -> None:
    assert fl.init({}, seed=0).generator.device.type == torch.device(device).type
    for v in new.theta.values():
        assert v.device.type == torch.device(device).type and bool(torch.isfinite(v).all())
    for key, v in info.items():  # metrics come back on the CPU
        if torch.is_tensor(v):
            assert v.device.type == "cpu", key
    assert float(info["weights"].sum()) == pytest.approx(1.0)
    for v in ev.values():
        assert v.device.type == "cpu" and bool(torch.isfinite(v).all())
    assert bool(((ev["accuracy"] >= 0) & (ev["accuracy"] <= 1)).all())


@pytest.mark.parametrize("agg", ["robust-hdp", "oracle", "pfa"])
def test_round_keeps_tensors_on_the_data_device(agg) -> None:
    """CPU: the round's outputs live on the data's device, metrics on the CPU (the same checks
    run on CUDA in the gpu test below)."""
    out = _round_on("cpu", _PRIVATE, agg, **({"max_iter": 200} if agg == "robust-hdp" else {}))
    _check_devices("cpu", *out)


def test_communicator_size_must_match_clients() -> None:
    from privdl.robust.trainer import federated_communicator

    cfg = FederatedConfig(batch_sizes=(2, 2), lr=0.1, rounds=1, sampling="full")
    _x, _y, data = _data([5, 9])
    model = build_model("linear", in_shape=(6,), n_classes=3)
    with pytest.raises(ConfigError, match="3 nodes for 2 clients"):
        FederatedDPSGD(
            model, data, config=cfg, aggregator=build_aggregator("fedavg"),
            comm=federated_communicator(3),
        )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_round_matches_cpu() -> None:
    """CUDA: a deterministic round (full batches, no noise) equals the CPU round within 1e-10;
    a private robust-HDP round (CUDA's random stream differs from the CPU's) stays on the
    device, gives finite accuracies and weights summing to 1."""
    _fl, cpu, _i, cpu_eval = _round_on("cpu", _DETERMINISTIC, "fedavg")
    out = _round_on("cuda", _DETERMINISTIC, "fedavg")
    _check_devices("cuda", *out)
    for k, v in cpu.theta.items():
        torch.testing.assert_close(out[1].theta[k].cpu(), v, rtol=0, atol=1e-10)
    torch.testing.assert_close(out[3]["accuracy"], cpu_eval["accuracy"])
    _check_devices("cuda", *_round_on("cuda", _PRIVATE, "robust-hdp", max_iter=200))


def test_batch_size_buckets_bound_padding_and_cover_every_client() -> None:
    """Classes within a factor 1.5 of their smallest b; every client in exactly one class."""
    from privdl.algorithms.federated import batch_size_buckets

    b = np.array([32, 64, 16, 32, 16, 128, 24, 100, 17])
    buckets = batch_size_buckets(b)
    members = sorted(int(i) for c in buckets for i in c)
    assert members == list(range(len(b)))
    for c in buckets:
        vals = b[c.numpy()]
        assert vals.max() <= 1.5 * vals.min()
    assert [sorted(b[c.numpy()].tolist()) for c in buckets] == [
        [16, 16, 17, 24],
        [32, 32],
        [64],
        [100, 128],
    ]
    assert len(batch_size_buckets(np.full(50, 32))) == 1


def test_bucketed_round_equals_one_bucket() -> None:
    """Computing the clients class by class (each padded to its own widest batch) gives the
    same round as all clients padded to the widest batch of all."""
    counts, b, eps = [60, 40, 50, 45], (4, 16, 5, 12), (1.0, 2.0, 4.0, 3.0)
    cfg = FederatedConfig(batch_sizes=b, lr=0.1, rounds=2, epsilons=eps, clip_norm=0.5)
    fl, _, params, *_ = _trainer(counts, cfg)
    assert len(fl.oracle.buckets) == 2
    bucketed, _ = fl.step(fl.init(params, seed=5))
    fl.oracle.buckets = [torch.arange(len(counts))]
    single, _ = fl.step(fl.init(params, seed=5))
    for k in single.theta:
        torch.testing.assert_close(bucketed.theta[k], single.theta[k], rtol=1e-12, atol=1e-14)


def test_robust_hdp_counts_rpca_solves_that_did_not_converge() -> None:
    """The aggregator counts RPCA solves stopped at max_iter (a reproduction silences their
    warning but records the count), passes the warning on, and keeps the count in its state."""
    from privdl.algorithms.aggregators import AggregationInput, RobustHDP

    g = torch.Generator().manual_seed(0)
    updates = torch.randn(500, 6, generator=g, dtype=torch.float64) * torch.arange(1.0, 7.0)
    inp = AggregationInput(
        updates=updates,
        clients=torch.arange(6),
        round_index=0,
        reported_eps=torch.ones(6),
        num_samples=torch.full((6,), 10.0),
    )
    capped = RobustHDP(max_iter=2)
    with pytest.warns(RPCANotConvergedWarning):
        capped(inp)
    assert capped.rpca_not_converged >= 1
    again = RobustHDP()
    again.load_state_dict(capped.state_dict())
    assert again.rpca_not_converged == capped.rpca_not_converged
    converged = RobustHDP(max_iter=5000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RPCANotConvergedWarning)
        converged(inp)
    assert converged.rpca_not_converged == 0


def test_rdp_calibration_meets_each_clients_target_with_unequal_sizes() -> None:
    """calibration="rdp" with client sizes 2x apart: each client's z_i, at its own Poisson rate
    q_i = b_i / N_i over E_i * rounds steps (Eq. 7), certifies its eps_i by dp-accounting written
    from scratch (a rate from another client's N, or steps of one round, would miss)."""
    import dp_accounting as dpa
    from dp_accounting import rdp

    from privdl.accounting.dpsgd import RDP_ORDERS

    counts, b, eps = [200, 400, 300], (10, 10, 20), (1.0, 1.0, 2.0)
    cfg = FederatedConfig(
        batch_sizes=b, lr=0.1, rounds=3, epsilons=eps, clip_norm=0.5, calibration="rdp"
    )
    fl, *_ = _trainer(counts, cfg)
    for i, (n_i, b_i, e_i) in enumerate(zip(counts, b, eps, strict=True)):
        steps = 3 * math.ceil(n_i / b_i)  # K = 1 local epoch per round
        acc = rdp.RdpAccountant(orders=RDP_ORDERS)
        event = dpa.PoissonSampledDpEvent(b_i / n_i, dpa.GaussianDpEvent(fl.noise_multipliers[i]))
        acc.compose(dpa.SelfComposedDpEvent(event, steps))
        assert e_i * (1 - 1e-3) <= acc.get_epsilon(cfg.delta) <= e_i
    assert fl.noise_multipliers[0] != pytest.approx(fl.noise_multipliers[1], rel=1e-3)


def test_robust_hdp_reestimation_schedule() -> None:
    """Algorithm 1 re-estimates every round (``reestimate_every=1``), every k-th round with k,
    and once with ``None`` (the reference code) unless a client never seen before takes part;
    then the new client's weight comes from the new estimate, the old clients' from theirs."""
    from privdl.algorithms.aggregators import AggregationInput, RobustHDP

    g = torch.Generator().manual_seed(0)
    scales = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    updates = torch.randn(400, 4, generator=g, dtype=torch.float64) * scales

    def inp(r: int, clients: list[int]) -> AggregationInput:
        idx = torch.tensor(clients)
        return AggregationInput(
            updates=updates[:, idx],
            clients=idx,
            round_index=r,
            reported_eps=torch.ones(len(clients)),
            num_samples=torch.full((len(clients),), 10.0),
        )

    def schedule(agg: RobustHDP, rounds) -> list[bool]:
        return [bool(agg(inp(r, c)).info["estimated"]) for r, c in rounds]

    same = [(r, [0, 1, 2]) for r in range(5)]
    assert schedule(RobustHDP(reestimate_every=1), same) == [True] * 5
    assert schedule(RobustHDP(reestimate_every=2), same) == [True, False, True, False, True]
    assert schedule(RobustHDP(reestimate_every=None), same) == [True] + [False] * 4
    frozen = RobustHDP(reestimate_every=None)
    assert schedule(frozen, [(0, [0, 1, 2]), (1, [0, 3]), (2, [0, 3]), (3, [1, 2])]) == [
        True,
        True,
        False,
        False,
    ]
    res = frozen(inp(4, [0, 1, 2, 3]))
    assert torch.isfinite(res.weights).all() and set(frozen.sigma2) == {0, 1, 2, 3}
    assert res.weights[3] < res.weights[0]  # client 3 is the noisiest


def test_default_calibration_is_the_accounted_one() -> None:
    """The API's default (the tightest certified accountant) delivers the targets as accounted
    (certified for eps_i over all rounds, nothing nominal); the reference code's accountant is
    opt-in and nominal."""
    kw = dict(batch_sizes=(8, 8, 16), lr=0.1, rounds=3, epsilons=(0.5, 2.0, 4.0))
    default = _trainer([40, 60, 80], FederatedConfig(**kw))[0]
    reference = _trainer([40, 60, 80], FederatedConfig(**kw, calibration="reference"))[0]
    pairs = zip(default.client_budgets(), reference.client_budgets(), strict=True)
    for (mine, ref), eps in zip(pairs, kw["epsilons"], strict=True):
        assert mine["nominal"] is None and ref["nominal"]["nominal"]
        assert eps * 0.97 <= mine["accounted"]["epsilon"] <= eps  # calibrated to the target
        assert mine["accounted"]["epsilon"] > ref["accounted"]["epsilon"]  # less noise, same eps
    assert np.all(default.noise_multipliers < reference.noise_multipliers)


def test_federated_config_accountant_follows_the_calibration() -> None:
    """Each client is accounted by the accountant that calibrated it (tightest by default; the
    reference code's nominal z_i by the tightest certified one); a mismatch is refused."""
    kw = dict(batch_sizes=(8,), lr=0.1, rounds=1, epsilons=(1.0,))
    assert FederatedConfig(**kw).calibration == "tightest"
    assert FederatedConfig(**kw).client_accountant == "tightest"
    assert FederatedConfig(**kw, calibration="rdp").client_accountant == "rdp"
    assert FederatedConfig(**kw, calibration="reference").client_accountant == "tightest"
    ref_rdp = FederatedConfig(**kw, calibration="reference", accountant="rdp")
    assert ref_rdp.client_accountant == "rdp"
    with pytest.raises(ConfigError, match="calibration 'tightest' needs accountant 'tightest'"):
        FederatedConfig(**kw, accountant="rdp")
    with pytest.raises(ConfigError, match="calibration must be one of"):
        FederatedConfig(**kw, calibration="pld")  # type: ignore[arg-type]
