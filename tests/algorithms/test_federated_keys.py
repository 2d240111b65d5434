"""Federated clients under ``key_source = "os"``: the server cannot rebuild a client's noise.

The attack (issue 29, item 1; docs/security.md s.1): a server that knows the seed of the clients'
generator replays it with zero gradients, following the documented draw order of
:mod:`privdl.algorithms.federated` (per local step ``rand(n, m_max)`` for Poisson sampling, then
``randn(n, *shape)`` per parameter), and subtracts the replayed noise from each client's update.
What is left is ``-lr sum_k g_k``, a function of the client's data whose norm is at most the
clipping bound ``lr C sum_k |B_k| / b_i`` (the attacker knows |B_k| from the replayed Poisson
draws). Oracle: that bound and the norm of the replayed noise, both computed here from the
documented order, not from privdl's code.

Control: a seeded run whose clients draw from the generator the attacker replays (what a
launched ``key_source = "os"`` run did before each client had its own key) -- the attack must
succeed there, or the test proves nothing. Keyed run: same shared seed, the residual is at the
noise level (the replayed and the true noise are independent: ratio about sqrt 2).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest
import torch

from privdl.algorithms.aggregators import build_aggregator
from privdl.algorithms.base import Keys
from privdl.algorithms.federated import flatten_tree
from privdl.data.batching import stack_partitions
from privdl.models import build_model
from privdl.robust.trainer import FederatedConfig, FederatedDPSGD

COUNTS, BATCH, EPS = [64, 48, 80, 64], (8, 6, 10, 8), (1.0, 2.0, 4.0, 8.0)
SHARED = 123456789  # the sampling seed the server broadcasts (and so knows)
AGGREGATORS = ["robust-hdp", "weiavg", "pfa", "dpfedavg", "mineps"]


@functools.cache
def _trainer(aggregator: str) -> tuple[FederatedDPSGD, dict]:
    """Four clients of a linear model with p = 2010 (the noise dominates a clipped step)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(COUNTS), 200, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (sum(COUNTS),), generator=g)
    parts = np.split(np.arange(sum(COUNTS)), np.cumsum(COUNTS)[:-1])
    model = build_model("linear", in_shape=(200,), n_classes=10)
    cfg = FederatedConfig(
        batch_sizes=BATCH, lr=0.1, rounds=3, epsilons=EPS, clip_norm=1.0, calibration="rdp"
    )
    fl = FederatedDPSGD(
        model, stack_partitions(x, y, parts), config=cfg, aggregator=build_aggregator(aggregator)
    )
    params = model.init(n_nodes=1, generator=torch.Generator().manual_seed(3), dtype=x.dtype)
    return fl, params


def _updates(fl: FederatedDPSGD, params: dict, keys: Keys) -> tuple[np.ndarray, tuple]:
    """Round 0's Delta_i of every client, and the clients' keys."""
    state = fl.algorithm.init(params, fl.oracle, fl.comm, keys=keys)
    deltas = fl.algorithm.local_updates(
        state.theta, torch.ones(4, dtype=torch.bool), state.generator, fl.oracle, fl.comm,
        keys=state.noise_keys, round_index=0,
    )  # fmt: skip
    return flatten_tree(deltas).numpy(), state.noise_keys


def _replay(fl: FederatedDPSGD, params: dict) -> tuple[np.ndarray, np.ndarray]:
    """The server's replay from SHARED: each client's noise part of Delta_i and its clipping
    bound."""
    alg = fl.algorithm
    n, width = alg.n, max(COUNTS)
    shapes = {k: v.shape[1:] for k, v in params.items()}
    counts = np.asarray(COUNTS)
    b = np.asarray(BATCH, float)
    rate = b / counts
    scale = alg.lr * alg.clip_norm * np.asarray(alg.noise_multipliers) / b
    gen = torch.Generator().manual_seed(SHARED)
    noise = np.zeros((n, sum(int(np.prod(s)) for s in shapes.values())))
    bound = np.zeros(n)
    for k in range(max(alg.local_steps)):
        u = torch.rand(n, width, generator=gen).double().numpy()
        drawn = [torch.randn((n, *s), generator=gen, dtype=torch.float64) for s in shapes.values()]
        z = np.concatenate([d.reshape(n, -1).numpy() for d in drawn], axis=1)
        on = np.asarray(alg.local_steps) > k
        noise[on] -= scale[on, None] * z[on]
        sizes = ((u < rate[:, None]) & (np.arange(width)[None, :] < counts[:, None])).sum(1)
        bound[on] += alg.lr * alg.clip_norm * sizes[on] / b[on]
    return noise, bound


def test_server_replay_recovers_seeded_clients_but_not_keyed_ones():
    """(The clients' updates do not depend on the server's aggregator.)"""
    fl, params = _trainer("dpfedavg")
    seeded, no_keys = _updates(fl, params, Keys(0, "seed", SHARED))
    keyed, keys = _updates(fl, params, Keys.from_os(0, sampling_seed=SHARED))
    assert no_keys == () and len(set(keys)) == 4 and all(len(k) == 32 for k in keys)
    noise, bound = _replay(fl, params)
    noise_norm = np.linalg.norm(noise, axis=1)
    # the attack works on the shared generator: a noise-free function of the data is left,
    # within the clipping bound and far below the noise
    control = np.linalg.norm(seeded - noise, axis=1)
    assert np.all(control <= bound * (1 + 1e-9)), (control, bound)
    assert np.all(control < 0.5 * noise_norm), (control, noise_norm)
    # ... and fails on keyed clients: what is left is noise (|a - b| ~ sqrt 2 |b| for independent
    # noise of equal scale), above the clipping bound
    residual = np.linalg.norm(keyed - noise, axis=1)
    assert np.all(residual > bound), (residual, bound)
    np.testing.assert_allclose(residual / noise_norm, np.sqrt(2), rtol=0.15)
    # the keyed update carries noise of the calibrated size (as the seeded one)
    np.testing.assert_allclose(np.linalg.norm(keyed, axis=1) / noise_norm, 1.0, rtol=0.15)
    print(f"noise {noise_norm}, seeded residual {control}, keyed residual {residual}")


@pytest.mark.parametrize("aggregator", AGGREGATORS)
def test_every_aggregator_runs_keyed_clients(aggregator):
    """A round of each server rule with keyed clients: the keys stay, the weights are finite."""
    fl, params = _trainer("dpfedavg")
    alg = replace(fl.algorithm, aggregator=build_aggregator(aggregator))
    state = alg.init(params, fl.oracle, fl.comm, keys=Keys.from_os(0))
    new, info = alg.step(state, fl.oracle, fl.comm)
    assert new.noise_keys == state.noise_keys and torch.isfinite(info["weights"]).all()
