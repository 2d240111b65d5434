"""A trusted dealer's noise (Whisper D-SGD's free covariance): data, draw, accountant, runs."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest
import torch

from privdl.accounting.design import account_design, dealer_step_rdp, design_step_rdp
from privdl.accounting.secrdp import decor_step_rdp
from privdl.errors import ConfigError, PrivacyError
from privdl.mechanisms.correlated import decor_noise, independent_noise
from privdl.mechanisms.dealer import DEALER_FORMAT, DealerCovariance, dealer_noise
from privdl.mechanisms.noise_design import NoiseDesign, load_design
from privdl.mechanisms.secrets import node_noise_keys
from privdl.topology import parse_graph


def _spd(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, n))
    return a @ a.T / n + 0.3 * np.eye(n)


def test_drawn_noise_has_the_dealer_covariance() -> None:
    n, size = 5, 200_000
    sigma = _spd(n)
    keys = node_noise_keys(range(n), seed=11)
    z = dealer_noise(keys, 3, size, dealer=DealerCovariance(sigma), dtype=torch.float64).numpy()
    emp = z @ z.T / size
    # entrywise standard error of a Wishart estimate: sqrt((S_ii S_jj + S_ij^2) / size)
    se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / size)
    assert np.all(np.abs(emp - sigma) < 6 * se)
    # keyed: the same step gives the same values, another step others
    again = dealer_noise(keys, 3, 1000, dealer=DealerCovariance(sigma), dtype=torch.float64)
    other = dealer_noise(keys, 4, 1000, dealer=DealerCovariance(sigma), dtype=torch.float64)
    # the same streams (a matrix product over fewer columns may round differently)
    assert torch.allclose(again, torch.from_numpy(z[:, :1000]), rtol=1e-12, atol=1e-14)
    assert not torch.equal(again, other)


def test_diagonal_covariance_is_each_nodes_own_stream_scaled() -> None:
    n, size = 6, 513
    scales = np.linspace(0.5, 2.0, n)
    keys = node_noise_keys(range(n), seed=2)
    got = dealer_noise(
        keys, 7, size, dealer=DealerCovariance(np.diag(scales**2)), dtype=torch.float64
    )
    unit = independent_noise(keys, 7, size, sigma=1.0, dtype=torch.float64)
    assert torch.allclose(got, unit * torch.from_numpy(scales)[:, None], rtol=1e-15, atol=0)


def test_decor_noise_takes_a_dealer_for_all_nodes_only() -> None:
    n = 4
    edges = np.array([[0, 1], [1, 2], [2, 3]])
    keys = node_noise_keys(range(n), seed=1)
    dealer = DealerCovariance(_spd(n, 3))
    got = decor_noise([], edges, n, keys, 2, 64, sigma_cor=0.0, sigma_cdp=0.0, design=dealer)
    assert got is not None
    assert torch.equal(got, dealer_noise(keys, 2, 64, dealer=dealer))
    with pytest.raises(ConfigError, match="all nodes"):
        decor_noise(
            [], edges, n, keys[:2], 2, 64, sigma_cor=0.0, sigma_cdp=0.0, nodes=[0, 1],
            design=dealer,
        )  # fmt: skip


def test_accountant_is_the_gaussian_mechanism_on_the_inverse_diagonal() -> None:
    sigma = _spd(7, 5)
    step = dealer_step_rdp(DealerCovariance(sigma), clip=0.3)
    assert step.step_rdp == pytest.approx(
        2 * 0.3**2 * np.max(np.diag(np.linalg.inv(sigma))), rel=1e-12
    )
    assert step.method == "dealer"
    for adversary in ("curious", "collusion:2", "ldp"):
        with pytest.raises(PrivacyError, match="eavesdropper only"):
            dealer_step_rdp(DealerCovariance(sigma), adversary=adversary)


def test_decor_covariance_through_the_dealer_equals_decors_eavesdropper_accountant() -> None:
    """Independent oracle: DECOR's own SecRDP accountant (Algorithm 2, q = 0)."""
    graph = nx.gnp_random_graph(12, 0.35, seed=4)
    topo = parse_graph("er:12:0.35:4")
    design = NoiseDesign.uniform(topo.edges, topo.n, sigma_cdp=0.8, sigma_cor=5.0)
    dealer = DealerCovariance(design.covariance())
    got = design_step_rdp(topo, dealer, clip=1.0).step_rdp
    want = decor_step_rdp(graph, sigma_cdp=0.8, sigma_cor=5.0, clip=1.0).step_rdp
    assert got == pytest.approx(want, rel=1e-9)
    account = account_design(topo, dealer, clip=1.0, steps=100, delta=1e-5)
    assert account.budget.threat_model == "eavesdropper+trusted-dealer"
    plain = account_design(topo, design, clip=1.0, steps=100, delta=1e-5)
    assert account.epsilon == pytest.approx(plain.epsilon, rel=1e-9)


def test_json_round_trip_and_one_line_errors(tmp_path) -> None:
    dealer = DealerCovariance(_spd(3), {"kind": "test"})
    path = tmp_path / "dealer.json"
    dealer.save(path)
    back = load_design(path)
    assert isinstance(back, DealerCovariance)
    assert np.array_equal(back.covariance, dealer.covariance) and back.metadata == {"kind": "test"}
    bad = {
        "n x n matrix": [[1.0, 0.0]],
        "not symmetric": [[1.0, 0.5], [0.0, 1.0]],
        "not positive definite": [[1.0, 2.0], [2.0, 1.0]],
        "finite": [[1.0, float("nan")], [float("nan"), 1.0]],
    }
    for message, matrix in bad.items():
        with pytest.raises(ConfigError, match=message):
            DealerCovariance(np.array(matrix))
    path.write_text(json.dumps({"format": DEALER_FORMAT, "n": 3, "covariance": [[1.0]]}))
    with pytest.raises(ConfigError, match="n = 3"):
        load_design(path)
    with pytest.raises(ConfigError, match="for 3 nodes"):
        dealer.check_graph(np.array([[0, 1]]), 2)


def _values(**extra):
    return dict(
        task="least-squares", algorithm="decor", graph="er:8:0.5:2", steps=6, lr=0.05,
        clip=1.0, clip_mode="batch_mean", seed=3, dtype="float64", ls_dim=5, **extra,
    )  # fmt: skip


def test_run_with_a_diagonal_dealer_is_the_ldp_run(tmp_path) -> None:
    """sigma^2 I through the dealer draws each node's own stream times sigma: DECOR's LDP run."""
    from privdl.experiments.decor import _simulate

    path = tmp_path / "dealer.json"
    DealerCovariance(0.49 * np.eye(8)).save(path)
    dealer_run = _simulate(_values(noise_design=str(path)))
    ldp_run = _simulate(_values(sigma=0.7))
    assert torch.allclose(dealer_run["_params"]["x"], ldp_run["_params"]["x"], rtol=1e-13)
    privacy = dealer_run["privacy"]
    assert privacy["threat_model"] == "eavesdropper+trusted-dealer"
    assert privacy["epsilon"] == pytest.approx(ldp_run["privacy"]["epsilon"], rel=1e-9)


def test_whisper_covariance_is_certified_and_no_noisier_than_the_edge_design() -> None:
    """Whisper's free covariance contains the edge-wise family (eavesdropper): its residual is at
    most the design's; the dealer's accountant certifies it at the target."""
    pytest.importorskip("cvxpy")
    from privdl.design.api import design_noise

    topo = parse_graph("er:10:0.4:1")
    got = design_noise(topo, epsilon=5.0, delta=1e-5, steps=100, horizon=3, whisper=True)
    assert got.whisper is not None and got.whisper_account is not None
    assert got.whisper_account.epsilon <= 5.0
    assert got.whisper_account.epsilon == pytest.approx(5.0, rel=1e-6)
    assert got.whisper_account.budget.threat_model == "eavesdropper+trusted-dealer"
    assert got.residual_whisper is not None
    assert got.residual_whisper <= got.residual * (1 + 1e-4)
