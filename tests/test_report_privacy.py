"""``privdl report``'s privacy-curves.png: drawn for runs recorded as mu-GDP, others named."""

from __future__ import annotations

from privdl.records import RunRecords
from privdl.report import make_report
from privdl.report_privacy import PRIVACY_CURVES


def _run(path, *, label, priv):
    rec = RunRecords(path)
    rec.start({"algorithm": "ldp", "graph": "ring:8", "seed": 0, "data_seed": 1, "label": label})
    for step in (0, 10):
        row = {"step": step, "loss": 1.0 / (step + 1)}
        if priv:
            row["privacy"] = priv
        rec.append(row)
    rec.finish({"completed": True})
    return path


def _priv(eps, mu):
    return {"epsilon": eps, "delta": 1e-5, "accountant": "gaussian", "threat_model": "ldp",
            "unit": "example", "neighbouring": "replace_one", "nominal": False, "notes": "",
            "mu": mu}  # fmt: skip


def test_privacy_curves_drawn_for_runs_with_mu(tmp_path):
    dirs = [
        _run(tmp_path / "a", label="exact-a", priv=_priv(3.0, 0.8)),
        _run(tmp_path / "b", label="exact-b", priv=_priv(8.0, 2.0)),
        _run(tmp_path / "c", label="sampled-c", priv=_priv(1.0, None)),
        _run(tmp_path / "d", label="plain-d", priv=None),
    ]
    report = make_report(dirs, tmp_path / "out")
    png = tmp_path / "out" / PRIVACY_CURVES
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    text = report.read_text()
    assert f"]({PRIVACY_CURVES})" in text
    skipped = next(line for line in text.splitlines() if line.startswith("Not in"))
    assert "sampled-c (no mu" in skipped and "plain-d (non-private)" in skipped
    assert "exact-a" not in skipped


def test_no_privacy_curves_without_mu(tmp_path):
    dirs = [_run(tmp_path / "c", label="sampled-c", priv=_priv(1.0, None))]
    report = make_report(dirs, tmp_path / "out")
    assert not (tmp_path / "out" / PRIVACY_CURVES).exists()
    assert PRIVACY_CURVES not in report.read_text()
