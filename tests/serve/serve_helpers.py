"""Requests to a ``privdl serve`` server, and the CLI's JSON to compare its numbers with."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from privdl.cli.main import main


def request(base: str, method: str, path: str, body: Any = None, raw: bytes | None = None):
    """(status, parsed JSON or text) of one request; never raises on a 4xx/5xx."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            status, payload, ctype = resp.status, resp.read(), resp.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        status, payload, ctype = exc.code, exc.read(), exc.headers["Content-Type"]
    if ctype and ctype.startswith("application/json"):
        return status, json.loads(payload)
    return status, payload.decode()


def run_job(base: str, kind: str, params: dict[str, Any], timeout: float = 120.0):
    """Submit a job and poll it to its end; returns the last poll (state done/error/...)."""
    status, job = request(base, "POST", "/api/jobs", {"kind": kind, "params": params})
    assert status == 202, job
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status, job = request(base, "GET", f"/api/jobs/{job['id']}")
        assert status == 200
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(0.02)
    raise AssertionError(f"job {kind} {params} did not finish in {timeout} s")


def cli_json(capsys, argv: list[str]) -> dict[str, Any]:
    """``privdl ARGV --json`` through the CLI's entry point."""
    code = main([*argv, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)
