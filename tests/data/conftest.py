"""Fixtures for the data tests: never touch the network or the user's cache or data dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from privdl.data import A9a, load_a9a


@pytest.fixture(autouse=True)
def _isolated_data_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PRIVDL_OFFLINE", "1")
    monkeypatch.delenv("PRIVDL_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def shared_dataset_dir(shared_datasets: Path) -> Callable[[str], Path]:
    """Return a function giving <shared datasets>/<sub>, skipping the test when it is absent."""

    def get(sub: str) -> Path:
        path = shared_datasets / sub
        if not path.is_dir():
            pytest.skip(f"shared dataset folder {path} is absent")
        return path

    return get


@pytest.fixture(scope="session")
def a9a() -> A9a:
    """The a9a rebuild from the embedded Adult files, loaded once per session (read-only)."""
    return load_a9a()
