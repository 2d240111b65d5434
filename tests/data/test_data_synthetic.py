"""DECOR least-squares data: x* against lstsq and autograd, b's variance against zeta^2 / i^2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privdl.data import least_squares_problem
from privdl.errors import DataError


def test_x_star_equals_lstsq_of_stacked_system() -> None:
    p = least_squares_problem(16, rng=np.random.default_rng(1))
    n, d = p.n, p.d
    assert (n, d) == (16, 10)
    np.testing.assert_allclose(p.a_scale**2, np.arange(1, 17) ** 2 / 16)  # A_i^2 = i^2/n I
    big_a = np.concatenate([s * np.eye(d) for s in p.a_scale])
    x_ls = np.linalg.lstsq(big_a, p.b.reshape(-1), rcond=None)[0]
    np.testing.assert_allclose(p.x_star, x_ls, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(p.local_gradients(p.x_star).mean(axis=0), 0, atol=1e-12)


def test_gradients_and_losses_match_autograd() -> None:
    p = least_squares_problem(5, d=3, zeta=2.0, rng=np.random.default_rng(2))
    x = np.random.default_rng(3).standard_normal((5, 3))
    xt = torch.tensor(x, requires_grad=True)
    a = torch.tensor(p.a_scale)[:, None]
    losses = 0.5 * ((a * xt - torch.tensor(p.b)) ** 2).sum(dim=1)
    losses.sum().backward()
    np.testing.assert_allclose(p.local_losses(x), losses.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(p.local_gradients(x), xt.grad.numpy(), rtol=1e-12)
    assert p.global_loss(p.x_star) <= p.global_loss(p.x_star + 1e-3)


def test_b_variance_is_zeta_squared_over_i_squared() -> None:
    p = least_squares_problem(4, d=200_000, zeta=3.0, rng=np.random.default_rng(4))
    np.testing.assert_allclose(p.b.var(axis=1), 9.0 / np.arange(1, 5) ** 2, rtol=0.02)
    same = least_squares_problem(4, d=5, rng=np.random.default_rng(7))
    again = least_squares_problem(4, d=5, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(same.b, again.b)


@pytest.mark.parametrize("kw", [{"n": 0}, {"n": 3, "d": 0}, {"n": 3, "zeta": float("nan")}])
def test_bad_arguments(kw: dict) -> None:
    n = kw.pop("n")
    with pytest.raises(DataError):
        least_squares_problem(n, rng=np.random.default_rng(0), **kw)
