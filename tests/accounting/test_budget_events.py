"""PrivacyBudget labels/validation, event -> dp-accounting mapping, DECOR example-level path."""

from __future__ import annotations

import json
import math

import dp_accounting as dpa
import networkx as nx
import numpy as np
import pytest

from privdl.accounting import (
    DecorStepEvent,
    PrivacyBudget,
    SubsampledGaussianEvent,
    account_decor,
    decor_step_rdp,
    event_epsilon,
)
from privdl.accounting.dpsgd import classic_from_curve, wang_fixed_size_rdp
from privdl.errors import PrivacyError


def test_budget_validation_and_label():
    b = PrivacyBudget(
        epsilon=1.2345,
        delta=1e-5,
        accountant="pld",
        neighbouring="add_remove",
        unit="example",
        threat_model="server",
    )
    assert "pld" in b.label() and "1.234" in b.label() and "NOMINAL" not in b.label()
    assert json.loads(json.dumps(b.to_dict()))["epsilon"] == 1.2345
    nom = PrivacyBudget(
        epsilon=3,
        delta=1e-5,
        accountant="nominal:x",
        neighbouring="replace_one",
        unit="user",
        threat_model="curious",
        nominal=True,
    )
    assert nom.label().startswith("NOMINAL")
    for kw in (
        {"delta": 0.0},
        {"delta": 1.0},
        {"epsilon": -1.0},
        {"unit": "record"},
        {"neighbouring": "swap"},
    ):
        args = (
            dict(
                epsilon=1.0,
                delta=1e-5,
                accountant="rdp",
                neighbouring="add_remove",
                unit="example",
                threat_model="server",
            )
            | kw
        )
        with pytest.raises(PrivacyError):
            PrivacyBudget(**args)


def test_event_mapping():
    ev = SubsampledGaussianEvent(noise_multiplier=2.0, sampling_rate=0.1, steps=5)
    assert ev.to_dp_event() == dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(2.0)), 5
    )
    ev = SubsampledGaussianEvent(
        noise_multiplier=2.0,
        sampling_rate=0.1,
        steps=5,
        sampling="fixed_size",
        dataset_size=300,
        neighbouring="replace_one",
    )
    assert ev.to_dp_event() == dpa.SelfComposedDpEvent(
        dpa.SampledWithoutReplacementDpEvent(300, 30, dpa.GaussianDpEvent(2.0)), 5
    )
    with pytest.raises(PrivacyError, match="dataset size"):
        SubsampledGaussianEvent(
            noise_multiplier=1, sampling_rate=0.1, steps=1, sampling="fixed_size"
        )
    for size in (2.5, True, 0):  # a fractional size would be rounded into the batch silently
        with pytest.raises(PrivacyError, match="dataset size must be a positive integer"):
            SubsampledGaussianEvent(
                noise_multiplier=1, sampling_rate=0.1, steps=1, sampling="fixed_size",
                dataset_size=size,
            )  # fmt: skip


def test_decor_equivalent_gaussian():
    """Whitened reduction: a DECOR step is a Gaussian with z = 1/sqrt(2 eps_step) (replace-one)."""
    ev = DecorStepEvent(step_rdp=0.02, steps=10, threat_model="eavesdropper")
    assert ev.noise_multiplier() == pytest.approx(5.0)
    assert ev.noise_multiplier("add_remove") == pytest.approx(10.0)
    # unsampled: dp-accounting's RDP of the equivalent Gaussian is alpha * T * eps_step
    acc = dpa.rdp.RdpAccountant(orders=[2.0, 8.0])
    acc.compose(ev.as_gaussian().to_dp_event())
    assert list(acc._rdp) == pytest.approx([2 * 10 * 0.02, 8 * 10 * 0.02])


def test_account_decor_example_level():
    ring = nx.cycle_graph(16)
    kw = dict(
        sigma_cdp=0.005,
        sigma_cor=0.1,
        clip=1.0,
        steps=1000,
        delta=1e-5,
        sampling_rate=64 / 3750,
        batch_size=64,
    )
    legacy = account_decor(ring, conversion="legacy-uncomposed", **kw)
    assert legacy.epsilon == pytest.approx(0.00758, abs=1e-5)
    assert legacy.budget.nominal and "NOT a DP guarantee" in legacy.budget.notes
    classic = account_decor(ring, conversion="classic", **kw)
    assert classic.epsilon == pytest.approx(19.1, abs=0.05)
    rdp_acc = account_decor(ring, conversion="rdp", **kw)
    assert rdp_acc.conversion == "rdp" and rdp_acc.budget.unit == "example"
    # the default is the tightest certified: dp-accounting has no PLD for fixed-size sampling,
    # so RDP here, labelled with the reason
    default = account_decor(ring, **kw)
    assert default.conversion == "tightest" and default.budget.accountant == "secrdp+rdp"
    assert default.epsilon == rdp_acc.epsilon and "no PLD for fixed-size" in default.budget.notes
    assert rdp_acc.epsilon < classic.epsilon
    # the per-step slope is Alg 2 with C replaced by C / b
    assert rdp_acc.step_rdp == pytest.approx(
        decor_step_rdp(ring, sigma_cdp=0.005, sigma_cor=0.1, clip=1 / 64).step_rdp
    )
    pois = account_decor(
        ring, sampling="poisson", neighbouring="add_remove", conversion="rdp", **kw
    )
    direct = event_epsilon(
        SubsampledGaussianEvent(
            noise_multiplier=2 / math.sqrt(2 * rdp_acc.step_rdp),
            sampling_rate=64 / 3750,
            steps=1000,
        ),
        delta=1e-5,
    )
    assert pois.epsilon == pytest.approx(direct, rel=1e-12)
    # Poisson: the default takes dp-accounting's PLD where it is tighter than RDP
    pois_default = account_decor(ring, sampling="poisson", neighbouring="add_remove", **kw)
    assert pois_default.budget.accountant == "secrdp+pld" and pois_default.epsilon < direct
    with pytest.raises(PrivacyError, match="fixed_size"):
        account_decor(ring, conversion="classic", sampling="poisson", **kw)
    # at tiny noise the general Wang bound exceeds the unsampled Gaussian's: subsampling never
    # hurts, so the example-level classic number is at most the user-level one at clip C / b
    tiny = dict(kw, sigma_cdp=0.005, sigma_cor=0.0005)
    sampled = account_decor(ring, conversion="classic", **tiny)
    wang = classic_from_curve(
        np.arange(2, 257),
        1000 * wang_fixed_size_rdp(sampled.step_rdp, 64 / 3750, np.arange(2, 257)),
        1e-5,
    )
    # capped by the exact epsilon of the unsampled mechanism (mu-GDP): the user-level default
    unsampled = account_decor(
        ring, sigma_cdp=0.005, sigma_cor=0.0005, clip=1 / 64, steps=1000, delta=1e-5
    )  # fmt: skip
    assert unsampled.budget.accountant == "secrdp+gaussian"
    assert unsampled.epsilon < wang and sampled.epsilon == pytest.approx(unsampled.epsilon)
    with pytest.raises(PrivacyError, match="batch"):
        account_decor(ring, sigma_cdp=1, sigma_cor=1, steps=10, delta=1e-5, sampling_rate=0.1)


@pytest.mark.parametrize("conversion", ["rdp", "pld", "classic"])
def test_account_decor_example_level_never_above_user_level_at_b1(conversion):
    """At b = 1 the example-level step is the user-level step, subsampled: its epsilon can never
    exceed the user-level one (joint quasi-convexity). At tiny noise a subsampled accountant's
    finite order grid gave ~2x the user-level number (and the Wang bound overflowed a float); the
    unsampled cap holds and its notes say it decided."""
    ring = nx.cycle_graph(16)
    kw = dict(sigma_cdp=0.05, sigma_cor=0.05, clip=1.0, steps=1000, delta=1e-5)
    user = account_decor(ring, **kw)
    sampling = {}
    if conversion == "pld":  # above the PLD's discretisation floor; Poisson (its only sampling)
        kw = dict(kw, sigma_cdp=0.5, sigma_cor=0.5)
        user = account_decor(ring, **kw)
        sampling = dict(sampling="poisson", neighbouring="add_remove")
    example = account_decor(
        ring, sampling_rate=0.001, batch_size=1, conversion=conversion, **kw, **sampling
    )
    assert math.isfinite(example.epsilon)
    assert example.epsilon <= user.epsilon * (1 + 1e-12)
    if conversion == "rdp":  # the grid-limited accountant alone is far above: the cap decided
        raw = event_epsilon(
            DecorStepEvent(
                step_rdp=example.step_rdp, steps=1000, threat_model="eavesdropper",
                sampling_rate=0.001, sampling="fixed_size", dataset_size=1000,
            ).as_gaussian("replace_one"),
            delta=1e-5,
        )  # fmt: skip
        assert raw > 1.5 * user.epsilon
        assert example.epsilon == pytest.approx(user.epsilon) and "capped" in example.budget.notes
    # at moderate noise the subsampled accountant is the tighter one and the cap stays silent
    moderate = account_decor(
        ring, sigma_cdp=20, sigma_cor=50, clip=1.0, steps=1000, delta=1e-5,
        sampling_rate=0.01, batch_size=1, conversion="rdp",
    )  # fmt: skip
    assert "capped" not in moderate.budget.notes


def test_account_decor_user_level_conversions_ordered():
    ring = nx.cycle_graph(16)
    eps = {
        c: account_decor(
            ring, sigma_cdp=20, sigma_cor=50, steps=1000, delta=1e-5, conversion=c
        ).epsilon
        for c in ("classic", "improved", "gaussian")
    }
    assert eps["gaussian"] < eps["improved"] < eps["classic"]
    res = account_decor(
        ring,
        sigma_cdp=20,
        sigma_cor=50,
        steps=1000,
        delta=1e-5,
        adversary="curious",
        with_bound=True,
    )
    assert res.theorem_step_rdp >= res.step_rdp
    d = res.to_dict()
    for key in ("epsilon", "delta", "step_rdp", "adversary", "conversion", "method"):
        assert key in d
