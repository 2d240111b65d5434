"""The threat model a run's records claim follows who can rebuild its noise (issue 29).

A launched run with keys from the seed (every rank knows it) must not claim an insider's threat
model; the launched runs themselves are tested in tests/comm (test_distributed_federated.py, the
federated server; test_open_core.py, every algorithm). Here, in one process: a simulation keeps
its label, and a run whose checkpoint says it was launched with the seed (``seed_shared``) is
relabelled with the same numbers, whatever its adversary.
"""

from __future__ import annotations

import pytest

from privdl.loop import build_run
from privdl.recipes.base import outsider_label, seed_shared
from privdl.registry import make_config

BASE = dict(task="least-squares", graph="ring:5", steps=4, clip=1.0, lr=0.05, sigma=0.5,
            clip_mode="batch_mean", dtype="float64")  # fmt: skip


@pytest.mark.parametrize(
    "algorithm, extra, launched_label",
    [
        ("decor", {"sigma_cor": 1.0, "adversary": "curious"}, "eavesdropper"),
        (
            "decor",
            {"sigma_cor": 1.0, "adversary": "collusion:2", "graph": "complete:5"},
            "eavesdropper",
        ),
        ("decor", {"sigma_cor": 1.0, "adversary": "eavesdropper"}, "eavesdropper"),
        ("ldp", {}, "eavesdropper"),
        ("cdp", {}, "central"),  # its adversary sees only the output: an outsider already
    ],
)
def test_a_seed_every_rank_knows_relabels_insiders_only(algorithm, extra, launched_label):
    run = build_run(make_config({**BASE, "algorithm": algorithm, **extra}))
    assert run.privacy is not None
    spent = run.privacy(4)
    assert spent is not None
    assert not seed_shared(run)  # one process: a simulation, labelled as accounted
    run.notes["seed_shared"] = True  # as a run resumed from a seeded launch's checkpoint
    assert seed_shared(run)
    label = outsider_label(spent, run)
    assert label["threat_model"] == launched_label
    numbers = {k: v for k, v in spent.items() if k not in ("threat_model", "notes")}
    assert {k: v for k, v in label.items() if k not in ("threat_model", "notes")} == numbers
    if spent["threat_model"] != launched_label:
        assert f"not against the {spent['threat_model']} threat model's adversary" in label["notes"]
    else:
        assert label == spent
    assert "every rank" in run.recipe.noise_rebuild(run)["every node's noise"]


def test_os_keys_are_not_a_shared_seed():
    """OS keys: nobody shares the seed, so nothing is relabelled (a launched OS-keyed federated
    run keeps ``server``: tests/comm/test_distributed_federated.py, slow)."""
    run = build_run(make_config({**BASE, "algorithm": "ldp", "key_source": "os"}))
    assert not seed_shared(run)
