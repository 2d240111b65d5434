"""Input (black-box) canaries beyond DP-SGD: canary examples through the task's own data path
for the gossip family (DECOR per threat model, LDP, CDP, PORTER-DP), seen through the
adversary's messages or only through the final models, and mislabelled images in a shared CNN
(one run). Correct code stays under its accounted epsilon; planted bugs are caught."""

from __future__ import annotations

import math

import numpy as np
import planted_bugs as bugs
import pytest
import torch

from privdl.audit import audit
from privdl.audit.api import audit_values
from privdl.audit.cnn import build_cnn_run, cnn_canaries, cnn_model
from privdl.audit.examples import build_example_run, example_views
from privdl.errors import ConfigError

#: ring:4, Poisson q = 0.5, a few steps, the noise given (sigma: the std on a node's averaged
#: gradient, 500 expected examples, C = 1) and accounted by RDP: no calibration, so small enough
#: for the default suite.
SMALL = {"graph": "ring:4", "sampling": "poisson", "sampling_rate": 0.5, "delta": 1e-5,
         "steps": 3, "trials": 2000, "batch": 1000, "sigma": 0.004, "accountant": "rdp"}  # fmt: skip


def test_curious_input_canaries_sit_at_the_accountants_worst_node_and_stay_under():
    """DECOR's curious node (ring:4): the canaries at the accountant's worst honest node, the
    adversary queries only its own final model (black box); the bound is under the accounted
    epsilon, labelled example-level add/remove against the curious threat model."""
    got = audit("decor", threat_model="curious", black_box=True, **SMALL)
    assert got.accounted["threat_model"] == "curious" and got.accounted["unit"] == "example"
    assert got.accounted["neighbouring"] == "add_remove"
    assert got.canary["node"] == 1 and "final models of nodes [0]" in got.view
    assert got.within_accounted and got.epsilon_lower <= got.epsilon_accounted


def test_cdp_input_canaries_seen_in_the_released_model_match_the_gradient_path():
    """CDP at example level: the released model after exact averaging, after every step (the
    model itself, not its increments); each present canary moves it by eta q C / (b n) per step
    on average (every node's own step, one holds the canary, then the exact average), absent
    trials only by the central noise."""
    steps, q, trials = 4, 0.5, 1000
    present = np.random.default_rng(2).permutation(np.arange(trials) < trials // 2)
    values = audit_values("cdp", {"graph": "ring:4", "sampling": "poisson", "sigma": 1e-3,
                                  "steps": steps}, None)  # fmt: skip
    run = build_example_run(values, present, sampling_rate=q, fillers=True)
    views = example_views(run, seed=5)
    assert views.shape == (trials, steps)
    eta, b, clip = run.cfg.lr, run.cfg.batch_size, run.cfg.clip
    last = views[:, -1]
    gain = last[present].mean() - last[~present].mean()
    expected = steps * eta * q * clip / b / 4
    spread = last[~present].std() * math.sqrt(2 / (trials / 2))
    assert abs(gain - expected) < 4 * spread + 0.1 * expected, (gain, expected)


def test_input_canaries_catch_one_nodes_noise_dropped():
    """LDP, ring:4: node 0 (the canaries' node) adds no noise, as the planted bug of the
    gradient-canary audits; the input canaries, seen through the messages, show it (the
    accountant claims epsilon 2.5 for the noise given)."""
    with bugs.noise_scaled_per_node([0.0, 1.0, 1.0, 1.0]):
        got = audit("ldp", **SMALL)
    assert got.epsilon_lower > got.epsilon_accounted, got.epsilon_lower


def test_black_box_input_canaries_catch_the_noise_dropped():
    """DECOR (eavesdropper), every node's noise dropped while the accountant claims epsilon 2.5:
    the canary's loss on the final models alone certifies more."""
    with bugs.noise_scaled_per_node([0.0] * 4):
        got = audit("decor", threat_model="eavesdropper", black_box=True, **SMALL)
    assert "black box" in got.view and got.test in ("fisher", "scan")
    assert got.epsilon_lower > got.epsilon_accounted, got.epsilon_lower


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "threat_model", "graph", "black_box"),
    [
        ("decor", "eavesdropper", "ring:4", False),
        ("decor", "eavesdropper", "ring:4", True),
        ("decor", "curious", "ring:4", False),
        ("decor", "collusion:2", "torus:3x3", False),
        ("decor", "collusion:2", "torus:3x3", True),
        ("ldp", None, "ring:4", True),
        ("cdp", None, "ring:4", False),
        ("cdp", None, "ring:4", True),
        ("porter-dp", None, "ring:4", False),
        ("porter-dp", None, "ring:4", True),
    ],
)
def test_correct_gossip_input_canaries_stay_under_the_accounted_epsilon(
    algorithm, threat_model, graph, black_box
):
    opts = {k: v for k, v in SMALL.items() if k not in ("sigma", "accountant")}
    got = audit(algorithm, threat_model=threat_model, black_box=black_box,
                **{**opts, "graph": graph, "steps": 10, "trials": 4000, "batch": 2000,
                   "epsilon": 4.0})  # fmt: skip
    assert got.accounted["unit"] == "example"
    assert got.within_accounted, (got.epsilon_lower, got.epsilon_accounted)


def test_a_zero_image_has_zero_gradient_in_the_bias_free_cnn():
    """What makes an excluded canary's zero image the same as no image (add/remove)."""
    torch.manual_seed(0)
    model = cnn_model()
    x = torch.zeros((1, 1, 8, 8))
    loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([2]))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert all(float(g.abs().max()) == 0.0 for g in grads)
    x, y = cnn_canaries(50, seed=3)
    assert x.shape == (50, 1, 8, 8) and int(y.max()) < 4
    values = audit_values("dpsgd", {"sampling": "poisson", "sigma": 0.1, "steps": 2}, None)
    included = np.arange(50) < 20
    run = build_cnn_run(values, included, sampling_rate=0.5, base=10, seed=3)
    assert run.cfg.batch_size == 30  # q times the 60 slots, whatever is included


def test_cnn_canaries_catch_the_noise_dropped_in_one_run():
    """Mislabelled images in a shared CNN, one run, black box (the loss on the final model):
    with DP-SGD's noise dropped (the accountant claims about 0.17 for the noise given) the
    model memorises the included canaries enough to certify more; with the noise the bound stays
    under the claim."""
    opts = {"sampling": "poisson", "sampling_rate": 0.5, "sigma": 0.5, "accountant": "rdp",
            "steps": 60, "lr": 2.0, "canaries": 300, "one_run": True, "black_box": True,
            "canary_model": "cnn"}  # fmt: skip
    with bugs.noise_scaled_per_node([0.0]):
        got = audit("dpsgd", **opts)
    assert got.canary["kind"].startswith("mislabelled image in a shared CNN")
    assert got.epsilon_lower > got.epsilon_accounted, got.epsilon_lower
    correct = audit("dpsgd", **opts)
    assert correct.within_accounted, correct.epsilon_lower


@pytest.mark.slow
@pytest.mark.parametrize(("algorithm", "threat_model"), [("dpsgd", None), ("ldp", None),
                                                         ("decor", "curious")])  # fmt: skip
def test_cnn_canaries_stay_under_the_accounted_epsilon(algorithm, threat_model):
    got = audit(algorithm, threat_model=threat_model, sampling="poisson", sampling_rate=0.5,
                epsilon=16.0, steps=100, lr=2.0, canaries=500, one_run=True, black_box=True,
                canary_model="cnn", **({} if algorithm == "dpsgd" else {"graph": "ring:4"}))  # fmt: skip
    assert got.within_accounted, got.epsilon_lower


@pytest.mark.parametrize(
    "kwargs",
    [
        {"canary_model": "cnn"},  # not one run, black box
        {"canary_model": "resnet", "one_run": True, "black_box": True},
        {"black_box": True},  # user level: no input canaries
        {"sampling": "poisson", "known_position": True},  # gossip: DP-SGD's only
    ],
)
def test_bad_input_canary_requests_are_refused(kwargs):
    with pytest.raises(ConfigError):
        audit("ldp", graph="ring:4", epsilon=1.0, **kwargs)
