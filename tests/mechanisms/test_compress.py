"""Tests for privdl.mechanisms.compress against closed forms and Monte-Carlo estimates.

Monte-Carlo draws are the rows of one batch: compressing ``x`` repeated R times gives R
independent draws (rows are compressed independently), so a test costs one vectorised call.
"""

from __future__ import annotations

import math

import pytest
import torch

from privdl.errors import ConfigError
from privdl.mechanisms.compress import (
    QSGD,
    Identity,
    RandomK,
    ScaledCompressor,
    TopK,
    UnbiasedRandomK,
    parse_compressor,
)

P = 200
R = 4000  # Monte-Carlo draws


def _x(seed: int = 0, P: int = P) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(P, generator=g, dtype=torch.float64) * torch.linspace(0.1, 3.0, P)


def _draws(comp, x: torch.Tensor, *, R: int = R, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return comp(x.expand(R, -1).clone(), generator=g)


COMPRESSORS = [
    RandomK(fraction=0.05),
    RandomK(k=30, bernoulli=True),
    UnbiasedRandomK(k=20).contractive(),
    TopK(fraction=0.1),
    QSGD(levels=4).contractive(),
    QSGD(levels=64).contractive(),
    Identity(),
]


@pytest.mark.parametrize("comp", COMPRESSORS, ids=lambda c: repr(c)[:40])
def test_contraction_inequality(comp) -> None:
    """Definition 3: E||C(x)-x||^2 <= (1-rho)||x||^2, checked with a 4-standard-error margin."""
    x = _x()
    err = ((_draws(comp, x) - x) ** 2).sum(1) / (x**2).sum()
    mean, se = err.mean().item(), err.std().item() / math.sqrt(R)
    assert mean <= 1 - comp.contraction(P) + 4 * se + 1e-12


@pytest.mark.parametrize(
    "comp", [RandomK(fraction=0.05), RandomK(k=30, bernoulli=True)], ids=["fixed", "bernoulli"]
)
def test_random_k_contraction_is_exact(comp) -> None:
    """Random sparsification: E||C(x)-x||^2 = (1 - k/P)||x||^2 exactly (PORTER Example 1)."""
    x = _x()
    err = ((_draws(comp, x) - x) ** 2).sum(1) / (x**2).sum()
    mean, se = err.mean().item(), err.std().item() / math.sqrt(R)
    assert abs(mean - (1 - comp.contraction(P))) <= 4 * se


def test_spec_monte_carlo_random_k() -> None:
    """random_k (PORTER Definition 3) by Monte Carlo: d = 1000, k = 50, 2000 draws: 0.95 +- 0.005; kept entries unscaled."""
    x = _x(3, 1000)
    y = _draws(RandomK(k=50), x, R=2000)
    assert ((y != 0).sum(1) == 50).all()
    kept = y != 0
    assert torch.equal(y[kept], x.expand_as(y)[kept])
    ratio = (((y - x) ** 2).sum(1) / (x**2).sum()).mean().item()
    assert abs(ratio - 0.95) < 0.005
    assert RandomK(k=50)(torch.zeros(3, 1000), generator=torch.Generator()).abs().sum() == 0


@pytest.mark.parametrize(
    "comp", [UnbiasedRandomK(k=20), UnbiasedRandomK(fraction=0.5), QSGD(levels=2), Identity()]
)
def test_unbiased(comp) -> None:
    """E C(x) = x: the Monte-Carlo mean's squared error has expectation omega||x||^2/R."""
    x = _x()
    y = _draws(comp, x)
    sq_err = ((y.mean(0) - x) ** 2).sum().item()
    expected = comp.omega(P) * (x**2).sum().item() / R
    assert sq_err <= 3 * expected + 1e-20
    # Biased random-k fails the same test by orders of magnitude.
    yb = _draws(RandomK(k=20), x)
    assert ((yb.mean(0) - x) ** 2).sum().item() > 100 * expected


@pytest.mark.parametrize("comp", [UnbiasedRandomK(k=20), QSGD(levels=4), QSGD(levels=20)])
def test_unbiased_variance_bound(comp) -> None:
    """E||C(x)-x||^2 <= omega||x||^2; for unbiased random-k it is equality."""
    x = _x()
    err = ((_draws(comp, x) - x) ** 2).sum(1) / (x**2).sum()
    mean, se = err.mean().item(), err.std().item() / math.sqrt(R)
    assert mean <= comp.omega(P) + 4 * se
    if isinstance(comp, UnbiasedRandomK):
        assert abs(mean - comp.omega(P)) <= 4 * se


def test_scaled_unbiased_random_k_equals_biased_random_k() -> None:
    x = _x().expand(5, -1).clone()
    a = UnbiasedRandomK(k=20).contractive()(x, generator=torch.Generator().manual_seed(7))
    b = RandomK(k=20)(x, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(a, b)
    assert UnbiasedRandomK(k=20).contraction(P) == pytest.approx(20 / P)


def test_top_k_keeps_largest_exactly() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 50, generator=g, dtype=torch.float64)
    y = TopK(k=7)(x, generator=g)
    for i in range(6):  # slow oracle: sort each row
        order = sorted(range(50), key=lambda j: -abs(x[i, j].item()))
        expect = torch.zeros(50, dtype=torch.float64)
        expect[order[:7]] = x[i, order[:7]]
        assert torch.equal(y[i], expect)
        assert ((y[i] - x[i]) ** 2).sum() <= (1 - 7 / 50) * (x[i] ** 2).sum()


def test_top_k_uses_absolute_values() -> None:
    x = torch.tensor([[-10.0, 1.0, 2.0, -0.5]])
    y = TopK(k=1)(x, generator=torch.Generator())
    assert torch.equal(y, torch.tensor([[-10.0, 0.0, 0.0, 0.0]]))


def test_qsgd_values_on_grid() -> None:
    x = _x().expand(10, -1).clone()
    y = QSGD(levels=8)(x, generator=torch.Generator().manual_seed(0))
    norm = torch.linalg.vector_norm(x[0])
    levels = y.abs() / norm * 8
    torch.testing.assert_close(levels, levels.round())
    assert ((torch.sign(y) == torch.sign(x)) | (y == 0)).all()
    assert (levels.round() - x.abs() / norm * 8).abs().max() < 1 + 1e-9


def _overlap_mean(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a != 0) & (b != 0)).sum(1).double().mean().item()


def test_randomness_independent_across_rows_and_calls() -> None:
    """Overlap of two independent k-subsets of [P] is hypergeometric: mean k^2/P, var known."""
    k, n = 40, 2000
    comp = RandomK(k=k)
    x = torch.ones(n, P)
    g = torch.Generator().manual_seed(5)
    y1, y2 = comp(x, generator=g), comp(x, generator=g)
    mean = k * k / P
    var = k * (k / P) * (1 - k / P) * (P - k) / (P - 1)
    tol = 5 * math.sqrt(var / (n // 2))
    assert abs(_overlap_mean(y1[0::2], y1[1::2]) - mean) < tol  # across rows
    assert abs(_overlap_mean(y1, y2) - mean) < tol  # across calls
    assert not torch.equal(y1, y2)


def test_same_seed_reproducible() -> None:
    x = _x().expand(3, -1).clone()
    for comp in (RandomK(k=5), QSGD(levels=3), UnbiasedRandomK(k=9)):
        a = comp(x, generator=torch.Generator().manual_seed(11))
        b = comp(x, generator=torch.Generator().manual_seed(11))
        assert torch.equal(a, b)


def test_bits() -> None:
    assert RandomK(k=6).bits(124) == 6 * 32 + 64
    assert RandomK(k=6, value_bits=64, seed_bits=0).bits(124) == 6 * 64  # authors' convention
    assert RandomK(fraction=0.05, index_encoding="indices").bits(124) == 6 * (32 + 7)
    assert TopK(k=10).bits(1024) == 10 * (32 + 10)
    assert TopK(k=10, index_encoding="bitmap").bits(1024) == 10 * 32 + 1024
    assert QSGD(levels=16).bits(100) == 32 + 100 * (1 + 5)
    assert QSGD(levels=16).contractive().bits(100) == QSGD(levels=16).bits(100)
    assert Identity(value_bits=64).bits(50890) == 50890 * 64
    assert RandomK(fraction=0.05).num_kept(51675) == 2583  # PORTER Figure 3 "random_2583"


def test_parse_compressor() -> None:
    assert parse_compressor("randk:0.05") == RandomK(fraction=0.05)
    assert parse_compressor("randk:6") == RandomK(k=6)
    assert parse_compressor("random:0.05") == RandomK(fraction=0.05)  # the alias the docs name
    assert parse_compressor("topk:0.1") == TopK(fraction=0.1)
    assert parse_compressor("qsgd:16") == QSGD(levels=16)
    assert parse_compressor("none") == Identity()
    assert parse_compressor("urandk:0.1") == UnbiasedRandomK(fraction=0.1)
    assert parse_compressor("bernk:0.1") == RandomK(fraction=0.1, bernoulli=True)
    assert isinstance(parse_compressor("qsgd:4").contractive(), ScaledCompressor)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "foo:1",
        "randk",
        "randk:",
        "randk:0",
        "randk:1.5",
        "randk:-0.1",
        "randk:abc",
        "qsgd:0",
        "qsgd:1.5",
        "none:3",
        "topk:nan",
    ],
)
def test_parse_compressor_rejects(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_compressor(bad)


def test_k_larger_than_P_rejected() -> None:
    with pytest.raises(ConfigError):
        RandomK(k=10)(torch.ones(2, 5), generator=torch.Generator())
    with pytest.raises(ConfigError):
        RandomK(k=2)(torch.ones(5), generator=torch.Generator())


def test_parse_compressor_fraction_or_count() -> None:
    """A number with a decimal point is a fraction of P, an integer a count: randk:1.0 keeps
    everything, randk:1 one coordinate."""
    from privdl.mechanisms.compress import parse_compressor

    assert parse_compressor("randk:1.0").num_kept(10) == 10
    assert parse_compressor("randk:1").num_kept(10) == 1
    assert parse_compressor("topk:0.5").num_kept(10) == 5
    assert parse_compressor("topk:3").num_kept(10) == 3
