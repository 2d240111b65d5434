"""The secure noise mode: a discrete Gaussian on a power-of-two grid (docs/security.md s.4).

Oracles: the closed-form pmf of N_Z(0, s^2), ``exp(-k^2 / (2 s^2)) / sum_j exp(-j^2 / (2 s^2))``
(Canonne, Kamath & Steinke 2020, Definition 1), by a chi-square test (and the test has power: the
rounded continuous Gaussian, a different pmf at small s, is rejected on the same samples);
exact arithmetic for the lattice (every released value an integer multiple of the grid) and for
the snapping margin (a vector clipped at the inner bound, then snapped, has norm <= C).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from privdl.errors import PrivacyError
from privdl.mechanisms.discrete_gaussian import (
    GRID_BITS,
    discrete_gaussian_exact,
    discrete_gaussian_streams,
    exact_scale,
    grid_for,
    secure_edge_noise,
    secure_noise,
    snap,
    snap_clip,
)

KEYS = [bytes([i]) * 32 for i in range(1, 5)]


def _chi2(samples: np.ndarray, pmf_of, s: float) -> float:
    """p-value of the samples against ``pmf_of(k)``, tails beyond 3 s pooled."""
    hi = int(3 * s) + 1
    support = np.arange(-int(40 * s) - 10, int(40 * s) + 11)
    pmf = pmf_of(support)
    pmf = pmf / pmf.sum()
    cells = [support <= -hi, *[support == v for v in range(-hi + 1, hi)], support >= hi]
    observed = [(samples <= -hi).sum(), *[(samples == v).sum() for v in range(-hi + 1, hi)],
                (samples >= hi).sum()]  # fmt: skip
    expected = np.array([pmf[c].sum() for c in cells]) * len(samples)
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("s", [0.6, 3.5])
def test_samples_follow_the_closed_form_pmf(s):
    k = discrete_gaussian_streams(KEYS, 3, 50_000, scale=s).numpy().ravel()
    assert _chi2(k, lambda x: np.exp(-(x**2) / (2 * s * s)), s) > 1e-3
    if s < 1:  # power: at small s the rounded continuous Gaussian is another law, rejected

        def rounded(x):
            return stats.norm.cdf((x + 0.5) / s) - stats.norm.cdf((x - 0.5) / s)

        assert _chi2(k, rounded, s) < 1e-6


@pytest.mark.parametrize("s", [1, pytest.param(3, marks=pytest.mark.slow)])  # ~2-4 s each
def test_the_exact_sampler_follows_the_closed_form_pmf(s):
    """CKS 2020 Algorithms 1-3 in integer arithmetic: chi-square against N_Z(0, s^2); at s = 1
    the rounded continuous Gaussian is rejected on the same samples (power); rows depend on
    their own key only."""
    k = discrete_gaussian_exact(KEYS, 3, 10_000, scale=s)
    assert k.dtype == torch.int64
    flat = k.numpy().ravel()
    assert _chi2(flat, lambda x: np.exp(-(x**2) / (2 * s * s)), s) > 1e-3
    if s == 1:

        def rounded(x):
            return stats.norm.cdf((x + 0.5) / s) - stats.norm.cdf((x - 0.5) / s)

        assert _chi2(flat, rounded, s) < 1e-4
    assert torch.equal(discrete_gaussian_exact(KEYS[1:2], 3, 10_000, scale=s), k[1:2])
    with pytest.raises(PrivacyError, match="integer scale"):
        discrete_gaussian_exact(KEYS, 3, 10, scale=0)


def test_the_exact_sampler_at_the_grid_scale():
    """At the secure mode's scale (sigma / gamma >= 2^20, rounded up): variance and mean of
    N_Z(0, s^2) and the values on the lattice."""
    sigma = 0.37
    grid = grid_for(sigma)
    s = exact_scale(sigma, grid)
    assert s == math.ceil(sigma / grid) and s >= sigma / grid
    x = secure_noise(KEYS[:2], 5, 4_000, sigma=sigma, exact=True)
    k = x / grid
    assert torch.equal(k, torch.round(k))
    assert float(x.var()) / (s * grid) ** 2 == pytest.approx(1.0, abs=0.06)
    assert float(x.mean()) == pytest.approx(0.0, abs=4 * sigma / math.sqrt(x.numel()))


def test_the_default_grid_moments_and_determinism():
    sigma = 0.37
    grid = grid_for(sigma)
    assert grid == 2.0 ** (math.floor(math.log2(sigma)) - GRID_BITS)
    assert 2**GRID_BITS <= sigma / grid < 2 ** (GRID_BITS + 1)
    x = secure_noise(KEYS, 5, 40_000, sigma=sigma)
    assert x.dtype == torch.float64
    k = x / grid
    assert torch.equal(k, torch.round(k))  # on the lattice, exactly
    assert float(x.mean()) == pytest.approx(0.0, abs=4 * sigma / math.sqrt(x.numel()))
    assert float(x.var()) / sigma**2 == pytest.approx(1.0, abs=0.02)  # N_Z's variance ~ s^2
    # row k is a function of (keys[k], counter) only: not of the other rows' keys
    assert torch.equal(secure_noise(KEYS[2:3], 5, 40_000, sigma=sigma), x[2:3])
    assert not torch.equal(secure_noise(KEYS[:1], 6, 40_000, sigma=sigma), x[:1])


def test_snapped_gradient_plus_noise_is_exact_and_within_the_clip():
    g = torch.Generator().manual_seed(0)
    sigma, clip, d = 0.05, 1.0, 10_000
    grid = grid_for(sigma)
    inner = snap_clip(clip, grid, d)
    assert inner == pytest.approx(clip - grid * math.sqrt(d) / 2)
    # adversarial: every coordinate half a grid step off, so rounding moves each up
    v = torch.full((3, d), 0.5, dtype=torch.float64) + torch.randint(0, 9, (3, d), generator=g)
    v = v * grid
    v = v * (inner / v.norm(dim=1, keepdim=True))
    snapped = snap(v, grid)
    assert bool((snapped.norm(dim=1) <= clip).all())
    total = snapped + secure_noise(KEYS[:3], 0, d, sigma=sigma)
    assert torch.equal(total / grid, torch.round(total / grid))
    with pytest.raises(PrivacyError, match="below the snapping margin"):
        snap_clip(1e-9, grid, d)


def test_secure_edge_noise_cancels_exactly_and_shards():
    """DECOR's correlated noise on the grid: the rows cancel to exactly 0 over the graph (integer
    sums), each node's row has variance deg * sigma_cor^2 (its edges' discrete Gaussians), and
    the rows a rank computes for its nodes equal those of the full computation."""
    from privdl.topology import parse_graph

    edges = np.asarray(parse_graph("ring:5").edges)
    keys = [bytes([7, e]) * 16 for e in range(len(edges))]
    sigma_cor, grid = 0.8, grid_for(0.3)
    full = secure_edge_noise(keys, edges, 5, 2, 5_000, sigma_cor=sigma_cor, grid=grid)
    assert full.dtype == torch.float64 and torch.equal(full / grid, torch.round(full / grid))
    assert torch.equal(full.sum(dim=0), torch.zeros(5_000, dtype=torch.float64))
    var = full.var(dim=1) / (2 * sigma_cor**2)  # ring: degree 2
    np.testing.assert_allclose(var.numpy(), 1.0, atol=0.08)
    part = secure_edge_noise(
        [k if {3, 1} & set(e) else None for k, e in zip(keys, edges.tolist(), strict=True)],
        edges, 5, 2, 5_000, sigma_cor=sigma_cor, grid=grid, nodes=[3, 1],
    )  # fmt: skip
    assert torch.equal(part, full[[3, 1]])


def test_secure_mode_end_to_end_and_its_refusals(tmp_path, capsys):
    """``privdl run ldp|cdp|dpsgd|decor --noise-mode secure``: certified by RDP (the default
    accountant is replaced by rdp, recorded), ldp/cdp/dpsgd with the float mode's RDP epsilon
    (the discrete Gaussian's zCDP; cdp's sum of discrete Gaussians adds a term below 2^-1000),
    DECOR with the epsilon of ldp at its sigma (its correlated noise is not credited), labelled;
    the other combinations are one line, exit 2, no run."""
    import json

    from privdl.cli.main import main

    common = ["--task", "least-squares", "--graph", "ring:4", "--steps", "4", "--eval-every",
              "4", "--clip", "1", "--clip-mode", "batch_mean", "--no-progress"]  # fmt: skip
    run = ["run", "ldp", *common, "--sigma", "0.5"]

    def privacy(name: str, argv: list[str]) -> dict:
        assert main([*argv, "--out", str(tmp_path / name)]) == 0
        rows = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return json.loads(rows[-1])["privacy"]

    for alg in ("ldp", "cdp", "dpsgd"):
        argv = ["run", alg, *common, "--sigma", "0.5"]
        plain = privacy(f"{alg}-float", [*argv, "--accountant", "rdp"])
        secure = privacy(f"{alg}-secure", [*argv, "--noise-mode", "secure"])
        assert secure["epsilon"] == plain["epsilon"] and secure["accountant"] == "secrdp+classic"
        assert secure["threat_model"] == plain["threat_model"]
        assert "secure noise: discrete Gaussian on the grid" in secure["notes"]
        assert secure["mu"] is None
        assert ("Kairouz, Liu & Steinke 2021" in secure["notes"]) == (alg != "ldp")
    rows = (tmp_path / "ldp-float" / "metrics.jsonl").read_text().splitlines()
    ldp = json.loads(rows[-1])["privacy"]  # the float ldp run above
    exact = privacy("ldp-exact", [*run, "--noise-mode", "secure-exact"])
    assert exact["epsilon"] == ldp["epsilon"] and "exact sampler (Canonne" in exact["notes"]
    summary = json.loads((tmp_path / "ldp-secure" / "summary.json").read_text())
    assert summary["config"]["noise_mode"] == "secure" and summary["config"]["accountant"] == "rdp"
    assert summary["config"]["key_source"] == "os"  # secure mode's keys: from the OS by default
    seeded = privacy("ldp-seeded", [*run, "--noise-mode", "secure", "--key-source", "seed"])
    assert seeded["epsilon"] == ldp["epsilon"]
    summary = json.loads((tmp_path / "ldp-seeded" / "summary.json").read_text())
    assert summary["config"]["key_source"] == "seed"  # a simulation may still ask for the seed
    decor = privacy("decor", ["run", "decor", *common, "--sigma", "0.5", "--sigma-cor", "2",
                              "--noise-mode", "secure"])  # fmt: skip
    assert decor["epsilon"] == ldp["epsilon"] and decor["threat_model"] == "ldp"
    assert "correlated noise is a signed sum of discrete Gaussians, not credited" in decor["notes"]
    capsys.readouterr()
    secure = ["--noise-mode", "secure"]
    for argv, why in (
        ([*run, *secure, "--accountant", "tightest"], "certified by RDP only"),
        (["run", "porter-dp", *common[:-3], "--sigma", "0.5", *secure], "not porter-dp"),
        (["run", "decor", *common, "--epsilon", "5", *secure], "give sigma and sigma_cor"),
        (["run", "dpsgd", "--task", "a9a", "--steps", "2", "--sigma", "1", "--clip", "1", *secure],
         "accounted at user level"),
        (["run", "robust-hdp", "--task", "a9a", "--clients", "4", "--budgets", "1,2,4,8",
          "--clip", "1", "--steps", "2", *secure], "no secure mode for the clients"),
    ):  # fmt: skip
        assert main([*argv, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and why in err, err
        assert not (tmp_path / "bad").exists()
