"""The top-level facade ``privdl.train`` / ``privdl.resume`` against the runner it wraps."""

from __future__ import annotations

import json

import pytest

import privdl
from privdl.errors import ConfigError
from privdl.loop import train as train_config
from privdl.registry import make_config

OPTIONS = {"algorithm": "decor", "task": "least-squares", "graph": "ring:6", "steps": 24,
           "eval_every": 8, "clip": 1.0, "clip_mode": "batch_mean", "epsilon": 5.0,
           "delta": 1e-5, "dtype": "float64"}  # fmt: skip


def test_train_equals_the_runner_and_labels_its_epsilon(tmp_path):
    summary = privdl.train(out=tmp_path / "api", progress=False, **OPTIONS)
    direct = train_config(make_config(OPTIONS), tmp_path / "direct", progress=False)
    assert summary["final"]["optimality_gap"] == direct["final"]["optimality_gap"]
    priv = summary["final"]["privacy"]
    assert priv["epsilon"] <= 5.0 and priv["delta"] == 1e-5 and not priv["nominal"]
    assert {"accountant", "neighbouring", "unit", "threat_model"} <= priv.keys()
    assert json.loads((tmp_path / "api" / "summary.json").read_text()) == summary.summary


def test_config_file_with_keyword_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[run]\nalgorithm = "dsgd"\ntask = "least-squares"\ngraph = "ring:4"\n'
                    "steps = 30\neval_every = 10\n")  # fmt: skip
    summary = privdl.train(config=path, steps=10, out=tmp_path / "o", progress=False)
    assert summary["steps_done"] == 10 and summary["config"]["graph"] == "ring:4"


def test_resume_continues_a_cut_off_run(tmp_path):
    full = privdl.train(out=tmp_path / "full", progress=False, **OPTIONS)
    train_config(make_config(OPTIONS), tmp_path / "part", progress=False, stop_after=8)
    resumed = privdl.resume(tmp_path / "part", progress=False)
    assert resumed["final"]["optimality_gap"] == full["final"]["optimality_gap"]


def test_bad_input_is_a_config_error_and_arguments_are_keyword_only(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'stepz'"):
        privdl.train(out=tmp_path / "x", stepz=3)
    with pytest.raises(TypeError):
        privdl.train(tmp_path / "x")  # type: ignore[misc]
    # pydantic would read True as 1 and run one step
    with pytest.raises(ConfigError, match="steps=True: steps takes a number or a name"):
        privdl.train(out=tmp_path / "x", steps=True)
    with pytest.raises(ConfigError, match="graph=False"):
        privdl.train(out=tmp_path / "x", graph=False)
    assert not (tmp_path / "x").exists()
