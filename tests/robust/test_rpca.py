"""Robust PCA (Principal Component Pursuit) against planted decompositions and pure noise."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from privdl.errors import ConfigError
from privdl.robust.rpca import (
    RPCANotConvergedWarning,
    principal_component_pursuit,
    shrink,
    svt,
)


def _planted(n1: int, n2: int, rank: int, frac: float, seed: int, dtype=torch.float64):
    """Candès et al. Section 4 model: L0 = X Y^T, X, Y ~ N(0, 1/n1); S0 = +-1 on a random support."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n1, rank, generator=g, dtype=dtype) / n1**0.5
    Y = torch.randn(n2, rank, generator=g, dtype=dtype) / n1**0.5
    support = torch.rand(n1, n2, generator=g) < frac
    signs = torch.where(torch.rand(n1, n2, generator=g) < 0.5, -1.0, 1.0).to(dtype)
    return X @ Y.T, torch.where(support, signs, torch.zeros_like(signs))


@pytest.mark.parametrize(
    "n1,n2,rank,method",
    [(100, 100, 5, "ialm"), (100, 100, 5, "admm"), (400, 40, 1, "ialm")],
)
def test_recovers_planted_low_rank_plus_sparse(n1, n2, rank, method) -> None:
    """Exact recovery regime (low rank, 5% gross corruptions): rel. error <= 1e-3, true rank."""
    L0, S0 = _planted(n1, n2, rank, 0.05, seed=n1 + rank)
    out = principal_component_pursuit(L0 + S0, method=method)
    assert out.converged and out.residual <= 1e-7
    assert (torch.linalg.norm(out.low_rank - L0) / torch.linalg.norm(L0)).item() < 1e-3
    assert (torch.linalg.norm(out.sparse - S0) / torch.linalg.norm(S0)).item() < 1e-3
    assert torch.linalg.matrix_rank(out.low_rank, rtol=1e-6).item() == rank


def test_float32_recovery() -> None:
    L0, S0 = _planted(100, 100, 5, 0.05, seed=3, dtype=torch.float32)
    out = principal_component_pursuit(L0 + S0, tol=1e-5)
    assert out.low_rank.dtype == torch.float32 and out.converged
    assert (torch.linalg.norm(out.low_rank - L0) / torch.linalg.norm(L0)).item() < 1e-3


def test_operators_against_numpy() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 7, generator=g, dtype=torch.float64)
    xn = x.numpy()
    np.testing.assert_allclose(
        shrink(x, 0.3).numpy(), np.sign(xn) * np.maximum(np.abs(xn) - 0.3, 0)
    )
    u, s, vt = np.linalg.svd(xn, full_matrices=False)
    np.testing.assert_allclose(svt(x, 1.0).numpy(), (u * np.maximum(s - 1.0, 0)) @ vt, atol=1e-12)
    assert svt(x, 1e6).abs().max() == 0


def test_cap_hit_warns_and_reports() -> None:
    L0, S0 = _planted(100, 100, 5, 0.05, seed=1)
    with pytest.warns(RPCANotConvergedWarning):
        out = principal_component_pursuit(L0 + S0, max_iter=3)
    assert not out.converged and out.iterations == 3 and out.residual > 1e-7


def test_no_warning_when_converged() -> None:
    L0, S0 = _planted(100, 100, 5, 0.05, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = principal_component_pursuit(L0 + S0)
    assert out.converged


def test_dual_tolerance_exposes_ialm_early_feasibility() -> None:
    """On pure noise, inexact ALM's mu growth reaches L + S = M long before the optimum: the
    primal test passes, the dual-residual test does not (and the cap warning fires)."""
    g = torch.Generator().manual_seed(4)
    M = torch.randn(1000, 10, generator=g, dtype=torch.float64)
    assert principal_component_pursuit(M, method="ialm").converged
    with pytest.warns(RPCANotConvergedWarning):
        out = principal_component_pursuit(M, method="ialm", dual_tol=1e-5, max_iter=200)
    assert not out.converged


def test_scale_equivariance() -> None:
    """PCP is positively homogeneous: PCP(aM) = a PCP(M) with Candès' mu and relative tol."""
    L0, S0 = _planted(150, 30, 1, 0.05, seed=5)
    a = principal_component_pursuit(L0 + S0, method="admm")
    b = principal_component_pursuit(7.5 * (L0 + S0), method="admm")
    torch.testing.assert_close(b.sparse, 7.5 * a.sparse, rtol=1e-6, atol=1e-9)


def test_zero_matrix_and_bad_input() -> None:
    out = principal_component_pursuit(torch.zeros(5, 3))
    assert out.converged and out.low_rank.abs().sum() == 0
    for bad in (
        torch.zeros(5),
        torch.ones(3, 3, dtype=torch.int64),
        torch.full((2, 2), float("nan")),
    ):
        with pytest.raises(ConfigError):
            principal_component_pursuit(bad)
    with pytest.raises(ConfigError):
        principal_component_pursuit(torch.ones(3, 3), method="svd")
    with pytest.raises(ConfigError):
        principal_component_pursuit(torch.ones(3, 3), preset="nope")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    L0, S0 = _planted(300, 30, 1, 0.05, seed=7)
    cpu = principal_component_pursuit(L0 + S0)
    gpu = principal_component_pursuit((L0 + S0).cuda())
    torch.testing.assert_close(gpu.low_rank.cpu(), cpu.low_rank, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "shape, dtype", [((30, 7), torch.float64), ((7, 30), torch.float64), ((40, 40), torch.float64),
                     ((2000, 12), torch.float32), ((500, 20), torch.float64)],
)  # fmt: skip
def test_svt_gram_path_equals_numpy_svd(shape, dtype) -> None:
    """Tall/wide matrices take the Gram form, square ones the SVD: both equal numpy's SVD
    thresholding, with singular values spread over three decades (1.5 .. 1000, tau = 1)."""
    g = torch.Generator().manual_seed(1)
    n1, n2 = shape
    k = min(n1, n2)
    u, _ = torch.linalg.qr(torch.randn(n1, k, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n2, k, generator=g, dtype=torch.float64))
    s = torch.logspace(3, math.log10(0.5), k, dtype=torch.float64)  # some below tau
    x = ((u * s) @ v.T).to(dtype)
    uu, ss, vt = np.linalg.svd(x.double().numpy(), full_matrices=False)
    want = (uu * np.maximum(ss - 1.0, 0)) @ vt
    got = svt(x, 1.0)
    assert got.dtype == dtype
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    np.testing.assert_allclose(got.double().numpy(), want, atol=tol * np.abs(want).max())


def test_shrink_is_bitwise_the_sign_form() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for tau in (0.0, 0.3, torch.tensor(0.7, dtype=torch.float64)):
        assert torch.equal(shrink(x, tau), torch.sign(x) * torch.clamp(x.abs() - tau, min=0.0))


def _numpy_fixed_mu_pcp(m: np.ndarray, mu: float, lam: float, tol: float, max_iter: int):
    """Candès et al. (2011) Algorithm 1 (fixed-mu ADMM), written from its equations in numpy."""
    s, y = np.zeros_like(m), np.zeros_like(m)
    for it in range(1, max_iter + 1):
        u, sv, vt = np.linalg.svd(m - s + y / mu, full_matrices=False)
        low = (u * np.maximum(sv - 1 / mu, 0)) @ vt
        r = m - low + y / mu
        s = np.sign(r) * np.maximum(np.abs(r) - lam / mu, 0)
        z = m - low - s
        if np.linalg.norm(z) <= tol:
            return low, s, it
        y = y + mu * z
    raise AssertionError("the numpy oracle did not converge")


def test_hdpfl_official_preset_is_fixed_mu_admm_with_the_induced_one_norm() -> None:
    """The reference code's constants: ADMM with fixed mu = n1 n2 / (4 ||M||_1), ||.||_1 the
    INDUCED norm (largest column sum; numpy's ord=1), absolute tolerance 5e-8: the same L, S and
    iteration count as an independent numpy solve with those constants, and not those of the
    entrywise-norm mu (the library's own ADMM default)."""
    low, sparse = _planted(30, 10, 1, 0.05, seed=3)
    m = (
        low
        + sparse
        + 0.01
        * torch.randn(30, 10, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    )
    res = principal_component_pursuit(m, preset="hdpfl_official")
    mn = m.numpy()
    lam = 1 / math.sqrt(30)
    mu_induced = mn.size / (4 * np.linalg.norm(mn, ord=1))
    l_ref, s_ref, iters = _numpy_fixed_mu_pcp(mn, mu_induced, lam, 5e-8, 10000)
    assert res.converged and res.iterations == iters
    np.testing.assert_allclose(res.low_rank.numpy(), l_ref, atol=1e-9)
    np.testing.assert_allclose(res.sparse.numpy(), s_ref, atol=1e-9)
    mu_entrywise = mn.size / (4 * np.abs(mn).sum())
    assert _numpy_fixed_mu_pcp(mn, mu_entrywise, lam, 5e-8, 10000)[2] != iters
