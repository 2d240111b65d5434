"""PORTER's theory constants (paper Section 4, Theorems 2-4 and Appendices B-D; docs/porter.md) and its output rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privdl.algorithms.porter import mixing_rate
from privdl.algorithms.porter_theory import (
    alpha_hat,
    eta_thm2,
    eta_thm3,
    eta_thm4,
    gamma_theory,
    nu_thm3,
    nu_thm4,
    sample_output_index,
    thm2_conditions,
    thm4_batch_size,
)
from privdl.errors import ConfigError
from privdl.topology import mixing_matrix, parse_graph


@settings(max_examples=200, deadline=None)
@given(alpha=st.floats(0.0, 0.999), rho=st.floats(1e-4, 0.9999), phi=st.floats(1e-4, 3.99))
def test_proof_constants_meet_the_proofs_conditions(alpha, rho, phi):
    """gamma_theory satisfies (12); with Theorem 2's eta, (16) and (25) hold too
    ((25) reduces to phi_m <= 4, so the boundary itself is left out to spare float ties)."""
    gamma = gamma_theory(alpha, rho)
    assert gamma**2 <= rho**2 / (96 * (1 - rho))  # (12), written out independently
    eta = eta_thm2(alpha=alpha, gamma=gamma, phi_m=phi, smoothness=3.0)
    assert thm2_conditions(alpha=alpha, rho=rho, gamma=gamma, eta=eta, smoothness=3.0) == {
        "(12)": True,
        "(16)": True,
        "(25)": True,
    }


def test_theorem4_constant_and_its_known_flaw():
    """Theorem 4 (App. D): eta L = sqrt(8/2072) ~ 0.062137; and it breaks the proof's (25)."""
    assert eta_thm4(smoothness=1.0) == pytest.approx(0.062137, abs=5e-7)
    assert eta_thm4(smoothness=4.0) == pytest.approx(0.062137 / 4, abs=5e-7)
    gamma = gamma_theory(0.5, 0.5)
    checks = thm2_conditions(
        alpha=0.5, rho=0.5, gamma=gamma, eta=eta_thm4(smoothness=1.0), smoothness=1.0
    )
    assert checks["(25)"] is False


def test_closed_forms_on_round_numbers():
    # gamma (1 - alpha) = 0.5 * 0.5 = 1/4: powers of 1/4 are exact
    assert eta_thm2(alpha=0.5, gamma=0.5, phi_m=0.5, smoothness=2.0) == pytest.approx(
        0.25 ** (4 / 3) * 0.5 / 64
    )
    assert eta_thm3(alpha=0.5, gamma=0.5, smoothness=1.0) == pytest.approx(0.25 ** (8 / 3) / 8288)
    assert nu_thm3(
        alpha=0.5, gamma=0.5, smoothness=1.0, initial_gap=4.0, phi_m=0.25
    ) == pytest.approx(1784 * 1.0 / 0.25 ** (4 / 3))
    nu = nu_thm4(alpha_hat=0.0, smoothness=2.0, initial_gap=8.0, steps=16)
    assert nu == pytest.approx(1.0)
    assert thm4_batch_size(sigma_g=0.5, nu=nu) == 144 and thm4_batch_size(sigma_g=0, nu=1) == 1


@pytest.mark.parametrize("spec", ["ring:10", "er:12:0.4:3", "torus:3x4"])
@pytest.mark.parametrize("gamma", [0.05, 0.5, 1.0])
def test_lemma1_alpha_hat_bounds_the_damped_mixing(spec, gamma):
    """Lemma 1: ||I + gamma (W - I) - J||_2 <= alpha_hat = 1 - gamma (1 - alpha), on FDLA W."""
    w = mixing_matrix(parse_graph(spec), "fdla")
    alpha = mixing_rate(w)
    n = w.n
    damped = np.eye(n) + gamma * (w.dense() - np.eye(n)) - np.full((n, n), 1.0 / n)
    assert np.linalg.norm(damped, 2) <= alpha_hat(alpha, gamma) + 1e-12


def test_output_index_is_uniform_over_agents_and_steps():
    g = torch.Generator().manual_seed(0)
    n, steps, draws = 3, 4, 24_000
    counts = np.zeros((n, steps))
    for _ in range(draws):
        i, t = sample_output_index(n=n, steps=steps, generator=g)
        counts[i, t - 1] += 1  # t in 1..T
    expected = draws / (n * steps)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 40.0  # 11 degrees of freedom: P(chi2 > 40) < 1e-4


@pytest.mark.parametrize(
    ("call", "msg"),
    [
        (lambda: gamma_theory(1.0, 0.5), "alpha"),
        (lambda: gamma_theory(0.5, 0.0), "rho"),
        (lambda: alpha_hat(0.5, 1.5), "gamma"),
        (lambda: eta_thm4(smoothness=-1.0), "smoothness"),
        (lambda: nu_thm4(alpha_hat=1.0, smoothness=1, initial_gap=1, steps=1), "alpha_hat"),
        (lambda: sample_output_index(n=0, steps=3, generator=torch.Generator()), "n >= 1"),
        (lambda: eta_thm2(alpha=0.1, gamma=0.1, phi_m=math.nan, smoothness=1), "phi_m"),
    ],
)
def test_bad_values_are_config_errors(call, msg):
    with pytest.raises(ConfigError, match=msg):
        call()
