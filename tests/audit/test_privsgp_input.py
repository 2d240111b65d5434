"""Input canaries for PrivSGP and PrivSGP-VR (Zhu et al. 2024, Algorithms 1 and 2): a canary
example in node 0's data, through the run's own sample oracle (the task's model, per-sample
clipping), one network copy per trial; node 0's messages or (black box) the final models seen.
Under the accounted epsilon for correct code, above the claim for planted bugs; and the
balance of the two worlds over batches of any size."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import planted_bugs as bugs
import pytest

from privdl.audit import audit
from privdl.audit.api import _signed_trials
from privdl.errors import ConfigError

#: PrivSGP on a ring of 4, J = 4 blocks of 16 examples a node, sigma given (no calibration).
WEAK = {"graph": "ring:4", "delta": 1e-5, "steps": 4, "trials": 1000, "input_canaries": True}


@pytest.mark.parametrize("black_box", [False, True])
def test_privsgp_input_canaries_stay_under_the_accounted_epsilon(black_box):
    got = audit("privsgp", sigma=0.05, black_box=black_box, **WEAK)
    acc = got.accounted
    assert (acc["unit"], acc["neighbouring"], acc["threat_model"]) == ("example", "replace_one",
                                                                       "ldp")  # fmt: skip
    assert "J=4 (B=16)" in acc["notes"] and got.canary["entries"] == 4
    assert got.trials == 1000 and got.threat_model == "ldp"
    assert 0.2 < got.epsilon_lower <= got.epsilon_accounted, got.epsilon_lower
    assert math.isnan(got.epsilon_lower_gdp)
    assert ("final models" in got.view) == black_box and "input canary" in got.canary["kind"]


def test_privsgp_vr_input_canaries_stay_under_the_accounted_epsilon():
    """The SAGA table holds the canary's gradient from the first pass: every step carries it in
    the table mean (2C / (B J) between the worlds), far below the (4 - 2/J) C / B accounted."""
    got = audit("privsgp-vr", sigma=0.01, **WEAK)
    acc = got.accounted
    assert (acc["unit"], acc["neighbouring"], acc["threat_model"]) == ("example", "replace_one",
                                                                       "ldp")  # fmt: skip
    assert 0.5 < got.epsilon_lower <= got.epsilon_accounted, got.epsilon_lower


def test_privsgp_input_canaries_catch_the_canary_nodes_noise_dropped():
    """Node 0's noise dropped (the other nodes' kept): its first message is its clean step."""
    with bugs.privsgp_node_noise_dropped(0, 4):
        got = audit("privsgp", sigma=0.5, **WEAK)
    assert got.epsilon_accounted < 2 < got.epsilon_lower, (got.epsilon_lower,
                                                           got.epsilon_accounted)  # fmt: skip


def test_privsgp_black_box_catches_block_clipping_after_averaging():
    """A data-path bug white-box gradient canaries cannot see: the block of 16 clipped as a mean
    (the canary moves its entry by C, not C / 16); the final models alone show it."""
    with bugs.privsgp_block_clipped_after_averaging():
        got = audit("privsgp", sigma=0.5, black_box=True, **WEAK)
    assert got.epsilon_lower > got.epsilon_accounted, (got.epsilon_lower, got.epsilon_accounted)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ls_dim": 2}, "makes its own data"),
        ({"one_run": True}, "independent trials"),
    ],
)
def test_bad_privsgp_input_audits_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        audit("privsgp", graph="ring:4", sigma=0.5, steps=2, input_canaries=True, **options)


def test_input_canaries_flag_is_for_privsgp_only():
    with pytest.raises(ConfigError, match="--input-canaries is for privsgp"):
        audit("ldp", graph="ring:4", sigma=0.5, steps=2, input_canaries=True)


@pytest.mark.parametrize(("trials", "batch"), [(10, 1), (15, 3), (9, 2), (2, 2), (1001, 1000)])
def test_signed_trials_balance_the_worlds_whatever_the_batches(trials, batch):
    """Every trial's world is +1 or -1, half each (one more of one where odd), over batches of
    any size, a batch of one included (it used to put each odd batch's extra trial in world
    +1: every trial, with batches of one)."""
    run = SimpleNamespace(cfg=SimpleNamespace(steps=3))
    sizes = []

    def views_of(world, signs, key):
        sizes.append(len(world))
        return np.asarray(world, dtype=float)[:, None]

    x, present = _signed_trials(run, views_of, trials=trials, batch=batch, seed=0,
                                rng=np.random.default_rng(0))  # fmt: skip
    assert len(present) == trials == sum(sizes) and max(sizes) <= batch
    assert np.array_equal(present, x[:, 0] > 0)
    assert abs(int(present.sum()) - int((~present).sum())) <= 1


@pytest.mark.parametrize("algorithm", ["privsgp", "privsgp-vr"])
def test_input_canary_moves_node_0s_first_message_as_the_algorithm_says(algorithm):
    """Oracle, by hand: at step 0 (model 0, noise 1e-9) the canary example +-Y's logistic
    gradient -+Y/2 is clipped to -+C and averaged over its block of B = 16, so node 0 sends
    ``gamma world C / B`` where its own draw (the algorithm's sampler, called on its own) is
    the canary's block (PrivSGP), and ``gamma world C / (B J)`` (the table mean) in every trial
    (PrivSGP-VR)."""
    import torch

    from privdl.algorithms.base import Keys
    from privdl.algorithms.privsgp import _sample_index
    from privdl.audit.api import audit_values
    from privdl.audit.privsgp import CANARY_ENTRY, build_privsgp_input_run, privsgp_input_views

    values = audit_values(algorithm, {"graph": "ring:4", "sigma": 1e-9, "steps": 1}, None,
                          input_canaries=True)  # fmt: skip
    run = build_privsgp_input_run(values)
    trials, seed, n, j, b = 400, 5, 4, 4, 16
    world = np.where(np.arange(trials) % 3 == 0, 1.0, -1.0)
    views = privsgp_input_views(run, world=world, seed=seed)
    gamma, clip = float(run.cfg.lr), float(run.cfg.clip)
    if algorithm == "privsgp":
        xi = _sample_index(Keys.from_seed(seed).sampling_seed, 0, n * trials, j,
                           torch.device("cpu"))  # fmt: skip
        drawn = (xi[::n] == CANARY_ENTRY).numpy()
        expected = np.where(drawn, gamma * world * clip / b, 0.0)
        assert 0.15 < drawn.mean() < 0.35  # each trial's own draw, about 1/J of them
    else:
        expected = gamma * world * clip / (b * j)
    assert views.shape == (trials, 1)
    np.testing.assert_allclose(views[:, 0], expected, rtol=1e-4, atol=1e-8)
