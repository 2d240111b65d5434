"""One-run audits (one training run, canaries included with probability 1/2) of DP-SGD and of a
federated client, and black-box audits of DP-SGD (the final model only, score = the canary's
loss): under the accounted epsilon for correct code, positive for a weakly private run, above
the claim for a planted bug."""

from __future__ import annotations

import math

import numpy as np
import planted_bugs as bugs
import pytest
import torch

from privdl.audit import audit
from privdl.audit.api import audit_values
from privdl.audit.examples import build_example_run, canary_data, canary_losses
from privdl.errors import ConfigError

#: A weakly private DP-SGD run at example level: sigma given (no calibration), q = 1/2, 5 steps,
#: RDP accounting (fast at small noise; an upper bound like any accountant's).
WEAK = {"sampling": "poisson", "sigma": 0.002, "steps": 5, "sampling_rate": 0.5,
        "accountant": "rdp"}  # fmt: skip


def test_one_run_dpsgd_is_positive_and_under_the_accounted_epsilon():
    got = audit("dpsgd", one_run=True, canaries=1000, **WEAK)
    acc = got.accounted
    assert (acc["unit"], acc["neighbouring"], acc["threat_model"]) == ("example", "add_remove",
                                                                       "central")  # fmt: skip
    assert acc["epsilon"] > 5  # weakly private
    assert 0.5 < got.epsilon_lower <= got.epsilon_accounted
    game = got.one_run
    assert game is not None and game["canaries"] == got.trials == 1000
    assert 400 < game["included"] < 600  # each canary in with probability 1/2
    assert game["correct"] <= game["guesses"] == game["k_plus"] + game["k_minus"]
    assert math.isnan(got.epsilon_lower_gdp) and got.to_dict()["one_run"]["candidates"] > 1
    small = {**WEAK, "steps": 2, "canaries": 100}
    runs = [audit("dpsgd", one_run=True, seed=s, **small).to_dict() for s in (1, 1, 2)]
    for r in runs:
        r.pop("seconds")
    assert runs[0] == runs[1] != runs[2]  # seeded


def test_one_run_black_box_dpsgd_is_positive_and_under_the_accounted_epsilon():
    got = audit("dpsgd", one_run=True, black_box=True, canaries=1000, **WEAK)
    assert 0.5 < got.epsilon_lower <= got.epsilon_accounted
    assert "final model" in got.view and "loss" in got.one_run["score"]


def test_one_run_catches_clipping_after_averaging():
    """The planted bug (clip the minibatch mean, not each example) at a claimed epsilon far
    below what one run can certify."""
    with bugs.clipping_after_averaging():
        got = audit("dpsgd", one_run=True, canaries=1000, sampling="poisson", sigma=0.05,
                    steps=5, sampling_rate=0.2)  # fmt: skip
    assert got.epsilon_lower > got.epsilon_accounted, (got.epsilon_lower, got.epsilon_accounted)


def test_one_run_federated_client_is_positive_and_under_the_accounted_epsilon():
    """Robust-HDP: client 0 holds the canaries (absent ones as zero-gradient slots); the server
    sees its update every round. RDP accounting keeps the calibration fast."""
    got = audit("robust-hdp", one_run=True, canaries=1000, budgets="10", steps=2,
                sampling_rate=0.5, accountant="rdp")  # fmt: skip
    acc = got.accounted
    assert (acc["unit"], acc["neighbouring"], acc["threat_model"]) == ("example", "add_remove",
                                                                       "server")  # fmt: skip
    assert 0.5 < got.epsilon_lower <= got.epsilon_accounted <= 10 + 1e-6


#: DP-FedAvg in one run on 500 canary examples at client 0 (budget 1, q = 1/2, 2 rounds).
FEDAVG = {"one_run": True, "canaries": 500, "budgets": "1", "steps": 2, "sampling_rate": 0.5,
          "accountant": "rdp"}  # fmt: skip


def test_one_run_federated_client_catches_its_noise_dropped():
    """Client 0's noise dropped in its local training while its accountant still counts it:
    one run, the server's view of the updates, certifies more than the claim."""
    with bugs.client_noise_scaled(0.0):
        bug = audit("dpfedavg", **FEDAVG)
    assert bug.accounted["threat_model"] == "server" and bug.confidence == 0.95
    assert bug.epsilon_lower > bug.epsilon_accounted, (bug.epsilon_lower, bug.epsilon_accounted)


@pytest.mark.slow
def test_one_run_dpfedavg_client_stays_under_its_accounted_epsilon():
    """The correct DP-FedAvg client of the test above: under the accounted epsilon (labelled
    example / add_remove / server), on 500 and on 5000 canaries."""
    for canaries in (500, 5000):
        got = audit("dpfedavg", **{**FEDAVG, "canaries": canaries})
        acc = got.accounted
        assert (acc["unit"], acc["neighbouring"], acc["threat_model"]) == (
            "example", "add_remove", "server")  # fmt: skip
        assert got.one_run["bound"].startswith("Steinke, Nasr")
        assert 0 <= got.epsilon_lower <= got.epsilon_accounted <= 1 + 1e-6


def test_black_box_trials_stay_under_the_accounted_epsilon():
    """Independent trials, the final model only: the fitted threshold on the canary's loss."""
    got = audit("dpsgd", black_box=True, trials=4000, batch=2000, **WEAK)
    assert 0.5 < got.epsilon_lower <= got.epsilon_accounted
    assert got.canary["kind"].startswith("example (input canary, black box")


def test_filler_slots_keep_the_run_fixed_and_losses_are_the_tasks():
    """With fillers the dataset and batch size do not depend on the inclusions, an absent slot
    is all zeros, and the black-box score is the logistic loss log(1 + exp(-Y w_k)) of the final
    model's weight."""
    included = np.array([True, False, True, False, False, True])
    x, y = canary_data(included, 1.0, fillers=True)
    assert x.shape == (6, 6) and torch.equal(x.abs().sum(1) > 0, torch.as_tensor(included))
    values = audit_values("dpsgd", {"sampling": "poisson", "sigma": 0.01, "steps": 2}, None)
    run = build_example_run(values, included, sampling_rate=0.5, fillers=True)
    other = build_example_run(values, ~included, sampling_rate=0.5, fillers=True)
    assert run.cfg.batch_size == other.cfg.batch_size == 3
    assert run.task.sampling_rate == other.task.sampling_rate == 0.5
    losses = canary_losses(run, seed=0)
    from privdl.audit.examples import _released_models

    w = _released_models(run, seed=0)[-1].reshape(-1).double().numpy()
    assert losses == pytest.approx(np.log1p(np.exp(-100.0 * w)), rel=1e-5)


@pytest.mark.parametrize(
    ("algorithm", "threat", "graph"),
    [("decor", "eavesdropper", "ring:8"), ("decor", "collusion:2", "torus:3x3")],
)
def test_one_run_gossip_is_positive_and_under_the_accounted_epsilon(algorithm, threat, graph):
    """One run, 4000 gradient canaries (one per coordinate, sign S_k drawn with probability
    1/2): 2000 reference canaries fit Fisher's test, 2000 are guessed; the bound is under the
    accounted epsilon (labelled user / replace_one) and has power."""
    got = audit(algorithm, threat_model=threat, graph=graph, epsilon=8.0, delta=1e-5, steps=5,
                one_run=True, canaries=4000)  # fmt: skip
    acc = got.accounted
    assert (acc["unit"], acc["neighbouring"]) == ("user", "replace_one")
    assert acc["epsilon"] == pytest.approx(8.0, rel=1e-6)
    game = got.one_run
    assert game is not None and game["canaries"] == 2000 and game["reference"] == 2000
    assert 900 < game["included"] < 1100
    assert 1.0 < got.epsilon_lower <= got.epsilon_accounted, got.epsilon_lower
    assert got.threat_model == (threat or "central")


def test_one_run_gossip_catches_a_dropped_noise():
    """The planted bug (node 0's noise dropped, the canary's) caught in one run of LDP."""
    keep = np.ones(8)
    keep[0] = 0.0
    with bugs.noise_scaled_per_node(keep):
        got = audit("ldp", graph="ring:8", epsilon=2.0, steps=5, one_run=True, canaries=2000)
    assert got.epsilon_lower > got.epsilon_accounted, (got.epsilon_lower, got.epsilon_accounted)


@pytest.mark.parametrize(
    ("algorithm", "options", "message"),
    [
        ("privsgp-vr", {"graph": "ring:4", "epsilon": 1.0}, "one-run audits run the gossip"),
        ("decor", {"graph": "ring:4", "epsilon": 1.0, "canaries": 10}, "at least 20"),
        ("decor", {"graph": "ring:4", "epsilon": 1.0, "black_box": True}, "black-box audits"),
        ("dpsgd", {"sampling": "poisson", "sigma": 1.0, "canaries": 5}, "at least 10"),
        ("dpsgd", {"sampling": "poisson", "sigma": 1.0, "canaries": 9000}, "too large"),
        ("robust-hdp", {"budgets": "4", "black_box": True}, "black-box audits run input"),
    ],
)
def test_bad_one_run_input_is_refused(algorithm, options, message):
    with pytest.raises(ConfigError, match=message):
        audit(algorithm, one_run=True, **options)


@pytest.mark.slow
def test_more_canaries_certify_more_and_stay_under_the_calibrated_epsilon():
    """The docs' figures: target 8 calibrated by the run's accountant (q = 1/2, 10 steps), one
    run on 1000 and on 5000 canaries, seeds 0-2: every bound under 8, and 5000 canaries certify
    more than 1000 (more guesses at the same accuracy)."""
    setting = {"sampling": "poisson", "epsilon": 8.0, "steps": 10, "sampling_rate": 0.5}
    small = [audit("dpsgd", one_run=True, canaries=1000, seed=s, **setting) for s in range(3)]
    large = [audit("dpsgd", one_run=True, canaries=5000, seed=s, **setting) for s in range(3)]
    for got in small + large:
        assert 0 < got.epsilon_lower <= got.epsilon_accounted == pytest.approx(8.0, rel=1e-4)
    assert min(g.epsilon_lower for g in large) > max(g.epsilon_lower for g in small)
