"""Shared fixtures: where the test datasets live (../shared/datasets beside the project)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI replays the same examples every run (a red build is reproducible); set
# HYPOTHESIS_PROFILE=explore locally to search new random examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATASETS = Path(os.environ.get("PRIVDL_TEST_DATASETS", ROOT.parent / "shared" / "datasets"))


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The shared datasets folder; tests that need it skip with a message when it is absent."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"shared datasets folder {SHARED_DATASETS} not found")
    return SHARED_DATASETS


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Tests never download anything."""
    monkeypatch.setenv("PRIVDL_OFFLINE", "1")
