"""No reference in the sources, tests, benchmarks, examples and tools to the design notes ("specs") that are not in the repository.

They cite the papers (section, equation, algorithm line, table, figure), the authors'
reference code, or our own docs pages; never a section of a spec file a reader cannot open.
"Graph spec", "compressor spec", "spec string" and the like (a string such as ``ring:16``) are
ordinary words and are not flagged.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "privdl"
#: Further folders whose ``*.py`` are scanned (this file excluded: it quotes the patterns).
OTHER_DIRS = ("tests", "benchmarks", "examples", "tools")

#: What a reference to a design note looks like.
SPEC_REF = re.compile(
    r"""
      \bspecs/                                   # specs/decor.md
    | \bspec\s+[\w-]+\.md\b                      # spec porter.md
    | \bspec\s*(?:§|s\.\s?\d|section\s+\d)       # spec §8.1, spec s.4.7, spec section 5
    | \bspec\s+(?:[A-Z]{1,2}\d+|\d+(?:\.\d+)*)\b # spec A7, spec D11, spec O5, spec 5.2
    | \bspec\s+(?:item|value|re-?simulation)\b     # spec item 15, "= spec value"
    | \b(?:the|paper\s*/\s*|vs\.?)\s*spec(?:'s)?\b(?!\s+string)  # the spec's CNN, paper/spec
    | \bspec\s+oracles?\b                         # spec oracle O11
    | \b(?:DECOR|PORTER|PrivSGP-VR|Robust-HDP)\s+spec\b  # the DECOR spec's LDP table
    """,
    re.IGNORECASE | re.VERBOSE,
)


def _files() -> list[Path]:
    here = Path(__file__).resolve()
    others = [p for d in OTHER_DIRS for p in (ROOT / d).rglob("*.py") if p.resolve() != here]
    return sorted([*SRC.rglob("*.py"), *(SRC / "presets").glob("*.toml"), *others])


def test_sources_are_found() -> None:
    files = _files()
    assert any(p.suffix == ".toml" for p in files) and len(files) > 50
    for d in ("tests", "benchmarks"):
        assert any(p.is_relative_to(ROOT / d) for p in files), d
    assert Path(__file__).resolve() not in files


@pytest.mark.parametrize(
    "text",
    [
        "(spec §8.1)",
        "spec s.4.7",
        "spec s.6.4, s.4.7",
        "(spec porter.md §6.3)",
        "specs/decor.md s.6.2",
        "(spec A7)",
        "(spec D11)",
        "spec 5.2",
        "spec decor.md item 15",
        "our accountant = spec value",
        "(spec re-simulation: up to 8.7)",
        "the spec's CNN",
        "as the spec advises",
        "paper / spec values",
        "paper/spec",
        "Robust-HDP, specs/robust-hdp.md section 5.2",
        "(spec oracle O11)",
        "Oracles: the DECOR spec's LDP table",
        "so DECOR spec §6.2's sigma_ldp",
    ],
)
def test_pattern_flags_spec_references(text: str) -> None:
    assert SPEC_REF.search(text)


@pytest.mark.parametrize(
    "text",
    [
        "a graph spec such as ring:16",
        "the spec string",
        "compressor spec (random:F)",
        "parse_compressor_spec(v)",
        "model_from_spec(spec, in_shape=in_shape)",
        "importlib.util.find_spec(name)",
        "timespec='milliseconds'",
        "the specification",
        "epsilon_spec=p['paper']",
        "The JSON-able spec that parse_optimizer turns back",
        "spectral_gap",
    ],
)
def test_pattern_spares_ordinary_uses(text: str) -> None:
    assert not SPEC_REF.search(text)


def test_no_spec_references_in_sources() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in _files()
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if SPEC_REF.search(line)
    ]
    assert not hits, "references to design notes outside the repository:\n" + "\n".join(hits)
