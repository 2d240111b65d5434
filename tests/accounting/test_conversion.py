"""Composition and RDP -> DP conversions against the paper's closed forms and dp-accounting."""

from __future__ import annotations

import math
import warnings

import dp_accounting as dpa
import networkx as nx
import pytest
from dp_accounting import pld, rdp

from privdl.accounting import (
    PrivacyWarning,
    classic_epsilon,
    classic_rho_for_epsilon,
    compose_convert,
    decor_step_rdp,
    gaussian_epsilon,
    improved_epsilon,
    step_rdp_for_epsilon,
)
from privdl.errors import PrivacyError


def test_acc1_value_and_acc2_inverse():
    got = compose_convert(1e-4, steps=1000, delta=1e-5, conversion="classic")
    assert got == pytest.approx(2.245966026289, abs=1e-11)
    assert classic_rho_for_epsilon(2.245966026289, 1e-5) == pytest.approx(0.1, rel=1e-10)


def test_acc1_is_lemma11_minimised_numerically():
    rho, delta = 0.37, 1e-6
    grid = [1 + 10 ** (k / 2000) for k in range(-8000, 8000)]
    brute = min(a * rho + math.log(1 / delta) / (a - 1) for a in grid)
    assert classic_epsilon(rho, delta) == pytest.approx(brute, rel=1e-6)
    assert classic_epsilon(rho, delta) <= brute


@pytest.mark.parametrize(
    ("c", "expected"), [(0, 8.43164), (10, 7.95087), (100, 3.52853), (1000, 1.92777)]
)
def test_fig2_reproduction(c, expected):
    """DECOR Fig 2: ring, sigma_cdp = 41.684..., T = 1000, delta = 1e-5 (paper App. D.1)."""
    s = decor_step_rdp(nx.cycle_graph(16), sigma_cdp=41.68410907477693, sigma_cor=c).step_rdp
    got = compose_convert(s, steps=1000, delta=1e-5, conversion="classic")  # the paper's
    assert got == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(("z", "steps", "delta"), [(3.0, 100, 1e-5), (1.0, 1, 1e-3)])
def test_improved_and_gaussian_agree_with_dp_accounting(z, steps, delta):
    rho = 1.0 / (2 * z**2)  # Gaussian RDP slope
    event = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), steps)
    acc = rdp.RdpAccountant()
    acc.compose(event)
    lib_rdp = acc.get_epsilon(delta)  # same CKS conversion on an order grid
    ours = improved_epsilon(steps * rho, delta)
    assert ours <= lib_rdp + 1e-9
    assert ours == pytest.approx(lib_rdp, rel=1e-2)
    acc = pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(event)
    assert gaussian_epsilon(steps * rho, delta) == pytest.approx(acc.get_epsilon(delta), rel=1e-2)
    assert gaussian_epsilon(steps * rho, delta) <= ours <= classic_epsilon(steps * rho, delta)


@pytest.mark.parametrize("conversion", ["classic", "improved", "gaussian"])
def test_inverse_round_trip(conversion):
    rho = step_rdp_for_epsilon(3.0, steps=500, delta=1e-5, conversion=conversion)
    eps = compose_convert(rho, steps=500, delta=1e-5, conversion=conversion)
    assert eps <= 3.0
    assert eps == pytest.approx(3.0, rel=1e-8)


def test_bad_inputs():
    for d in (0.0, 1.0, -1e-5, 2.0):
        with pytest.raises(PrivacyError, match="delta"):
            classic_epsilon(0.1, d)
    with pytest.raises(PrivacyError):
        compose_convert(0.1, steps=0, delta=1e-5)
    with pytest.raises(PrivacyError, match="conversion"):
        compose_convert(0.1, steps=3, delta=1e-5, conversion="magic")


def test_composition_is_linear_in_steps():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyWarning)
        s = decor_step_rdp(nx.cycle_graph(8), sigma_cdp=2, sigma_cor=3).step_rdp
    assert compose_convert(s, steps=10, delta=1e-5) == pytest.approx(
        compose_convert(10 * s, steps=1, delta=1e-5), rel=1e-14
    )
