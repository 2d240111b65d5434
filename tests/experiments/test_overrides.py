"""``--set KEY=VALUE`` overrides: parsed as the value they replace; bad keys/values refused."""

from __future__ import annotations

import pytest

from privdl.errors import ConfigError
from privdl.experiments import apply_overrides

PRESET = {"steps": 40, "lr": 0.5, "seeds": [1], "eps": [1.0, 3.0], "flag": False, "name": "x"}


def test_values_take_the_type_of_what_they_replace() -> None:
    got = apply_overrides(
        PRESET,
        {"steps": "7", "lr": "2e-3", "seeds": "1,123", "eps": "", "flag": "true", "name": "y"},
        name="p",
    )
    assert got == {"steps": 7, "lr": 2e-3, "seeds": [1, 123], "eps": [], "flag": True, "name": "y"}
    assert PRESET["seeds"] == [1]  # the preset itself is not modified


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"bogus": "1"}, "unknown setting 'bogus'"), ({"steps": "many"}, "expected a int")],
)
def test_bad_overrides_are_one_line_errors(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        apply_overrides(PRESET, overrides, name="p")


@pytest.mark.parametrize("name", ["decor-fig1a", "decor-fig1b"])
def test_decor_fig1a_fig1b_take_overrides_and_refuse_unknown_keys(tmp_path, name) -> None:
    """The reproductions pass ``--set`` through the parser before any run starts."""
    from privdl.experiments import get

    run = get(name).run
    with pytest.raises(ConfigError, match=f"unknown setting 'bogus' for {name}"):
        run(tmp_path / name, quick=True, overrides={"bogus": "1"})
    with pytest.raises(ConfigError, match="expected a int"):
        run(tmp_path / name, quick=True, overrides={"steps": "many"})
