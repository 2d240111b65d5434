"""Clipping helpers against their closed forms (DECOR Alg. 1 line 2; PORTER eq. (5))."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privdl.engine import clip_by_global_norm, clip_factor, global_norm
from privdl.errors import PrivacyError

norms_st = st.lists(st.floats(0.0, 1e3, allow_nan=False), min_size=1, max_size=8)


@settings(max_examples=50, deadline=None)
@given(norms=norms_st, c=st.floats(1e-3, 1e2), scale=st.floats(0.0, 5.0))
def test_clip_factor_closed_forms(norms, c, scale):
    t = torch.tensor(norms, dtype=torch.float64)
    hard = clip_factor(t, c, kind="hard", scale=scale)
    smooth = clip_factor(t, c, kind="smooth")
    for i, v in enumerate(norms):
        want_hard = scale * (min(1.0, c / v) if v > 0 else 1.0)
        assert hard[i].item() == pytest.approx(want_hard, rel=1e-12, abs=1e-300)
        assert smooth[i].item() == pytest.approx(c / (c + v), rel=1e-12)
    assert torch.equal(t, torch.tensor(norms, dtype=torch.float64))  # input untouched


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 4),
    c=st.floats(1e-2, 10.0),
    seed=st.integers(0, 1000),
    scale=st.floats(1e-3, 1e3),
)
def test_clip_by_global_norm_gives_the_clipped_norm(n, c, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    grads = {
        "w": scale * torch.randn(n, 3, 2, generator=gen, dtype=torch.float64),
        "b": scale * torch.randn(n, 3, generator=gen, dtype=torch.float64),
    }
    nrm = torch.sqrt((grads["w"] ** 2).sum((1, 2)) + (grads["b"] ** 2).sum(1))
    torch.testing.assert_close(global_norm(grads), nrm)
    hard = global_norm(clip_by_global_norm(grads, c, kind="hard"))
    smooth = global_norm(clip_by_global_norm(grads, c, kind="smooth"))
    for i in range(n):
        v = nrm[i].item()
        assert hard[i].item() == pytest.approx(min(v, c), rel=1e-10)
        assert smooth[i].item() == pytest.approx(c * v / (c + v), rel=1e-10)
    # direction is kept
    out = clip_by_global_norm(grads, c)
    ratio = out["w"] / grads["w"]
    assert torch.allclose(ratio, ratio[:, :1, :1].expand_as(ratio))


def test_clip_factor_rejects_bad_threshold():
    with pytest.raises(PrivacyError):
        clip_factor(torch.ones(2), 0.0)
    with pytest.raises(PrivacyError):
        clip_factor(torch.ones(2), 1.0, kind="soft")
    assert math.isfinite(clip_factor(torch.zeros(1), 1.0).item())
