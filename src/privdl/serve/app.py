"""The HTTP server of ``privdl serve``: the standard library's ``ThreadingHTTPServer``.

Routes (JSON in and out; every bad input is a 4xx with ``{"error": one line}``, never a 500):

* ``GET /`` and ``GET /static/NAME``: the page (``privdl/resources/serve``; nothing external);
* ``GET /api/limits``: what the page refuses (:data:`privdl.serve.compute.LIMITS`);
* ``GET /api/graph?graph=SPEC``: the graph's facts and, for a small graph, its drawing;
* ``POST /api/upload`` ``{"filename", "text"}``: an edge list, checked by the CLI's reader; the
  answer names it ``upload:HASH`` for the other requests;
* ``POST /api/jobs`` ``{"kind", "params"}``: a computation (``decor``, ``dpsgd``,
  ``calibrate-decor``, ``calibrate-dpsgd``, ``plan``), its fields checked before it is queued;
* ``GET /api/jobs/ID``: its state and progress (its result once done);
* ``POST /api/jobs/ID/cancel``; ``GET /api/jobs/ID/download?format=json|csv``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import ipaddress
import json
import math
import socket
import sys
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from privdl import __version__
from privdl.errors import ConfigError
from privdl.serve import compute
from privdl.serve.jobs import JobQueue, user_message
from privdl.topology import Topology

#: The page's files (privdl/resources/serve) and their content types.
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}  # fmt: skip
#: Where the page's files ship (package data: pyproject's ``resources/**/*``).
STATIC_DIR = Path(__file__).resolve().parent.parent / "resources" / "serve"
#: Graphs and uploads kept in memory (the oldest forgotten first).
KEEP_GRAPHS = 16
KEEP_UPLOADS = 32


class HttpError(Exception):
    """A response other than 200, with its one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def static_file(name: str) -> tuple[bytes, str]:
    """A file of the page by its bare name (no directories: nothing else is served)."""
    suffix = "." + name.rsplit(".", 1)[-1] if "." in name else ""
    if "/" in name or "\\" in name or name.startswith(".") or suffix not in STATIC_TYPES:
        raise HttpError(404, f"no such file: {name[:60]!r}")
    res = STATIC_DIR / name
    if not res.is_file():
        raise HttpError(404, f"no such file: {name[:60]!r}")
    return res.read_bytes(), STATIC_TYPES[suffix]


def jsonable(obj: Any) -> Any:
    """``obj`` for ``JSON.parse``: tuples as lists, numpy scalars as numbers, non-finite floats
    as the strings ``"inf"``, ``"-inf"``, ``"nan"`` (JSON has no Infinity)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def flatten(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf: ``compare[0].epsilon``, ``curves.mu``, ..."""
    if isinstance(obj, dict):
        return [kv for k, v in obj.items() for kv in flatten(v, f"{prefix}.{k}" if prefix else k)]
    if isinstance(obj, list):
        return [kv for i, v in enumerate(obj) for kv in flatten(v, f"{prefix}[{i}]")]
    return [(prefix, obj)]


def to_csv(result: dict[str, Any]) -> str:
    """The numbers as a two-column CSV: ``key, value`` (floats in full precision)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["key", "value"])
    for key, value in flatten(result):
        writer.writerow([key, repr(value) if isinstance(value, float) else value])
    return buf.getvalue()


class App:
    """The server's state: the job queue, graphs built and edge lists uploaded."""

    def __init__(self) -> None:
        self.jobs = JobQueue()
        self._graphs: OrderedDict[str, Topology] = OrderedDict()
        self._uploads: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._facts: OrderedDict[str, tuple[Topology, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    # -- graphs
    def graph(self, ref: str) -> Topology:
        """A spec string or ``upload:HASH``, built once (the most recent ones kept)."""
        if not isinstance(ref, str) or not ref.strip():
            raise ConfigError("graph: give a graph spec such as ring:16, or upload an edge list")
        ref = ref.strip()
        with self._lock:
            if ref in self._graphs:
                self._graphs.move_to_end(ref)
                return self._graphs[ref]
        if ref.startswith("upload:"):
            with self._lock:
                upload = self._uploads.get(ref)
            if upload is None:
                raise ConfigError(
                    f"graph {ref!r}: this server holds no such upload (it keeps uploads in "
                    "memory only); upload the edge-list file again"
                )
            topo = compute.graph_from_edge_list(upload[1], upload[0])
        else:
            topo = compute.graph_from_spec(ref)
        with self._lock:
            self._graphs[ref] = topo
            while len(self._graphs) > KEEP_GRAPHS:
                self._graphs.popitem(last=False)
        return topo

    def facts(self, ref: str) -> dict[str, Any]:
        """:func:`~privdl.serve.compute.graph_facts` of a graph, computed once per graph kept."""
        topo = self.graph(ref)
        with self._lock:
            cached = self._facts.get(ref)
        if cached is not None and cached[0] is topo:
            return cached[1]
        facts = compute.graph_facts(topo)
        with self._lock:
            self._facts[ref] = (topo, facts)
            while len(self._facts) > KEEP_GRAPHS:
                self._facts.popitem(last=False)
        return facts

    def upload(self, body: dict[str, Any]) -> dict[str, Any]:
        text, filename = body.get("text"), str(body.get("filename") or "edges.txt")
        if not isinstance(text, str):
            raise ConfigError("upload: send the edge list's text")
        topo = compute.graph_from_edge_list(text, filename)  # its errors before it is kept
        ref = "upload:" + hashlib.sha256(text.encode()).hexdigest()[:16]
        with self._lock:
            self._uploads[ref] = (filename, text)
            self._graphs[ref] = topo
            while len(self._uploads) > KEEP_UPLOADS:
                self._uploads.popitem(last=False)
        return {"graph": ref, "filename": filename, "facts": self.facts(ref)}

    # -- jobs
    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        """Check the fields (and build the graph) now, then queue the computation."""
        kind = body.get("kind")
        params = body.get("params")
        if not isinstance(params, dict):
            raise ConfigError("params: expected an object of the form's fields")
        work: Callable[[compute.Progress], dict[str, Any]]
        if kind in ("decor", "calibrate-decor"):
            spec = str(params.get("graph") or "")
            topo = self.graph(spec)
            if kind == "decor":
                compute.decor_settings(params)
                topo.require_connected("DECOR accounting")
                work = lambda p: compute.decor_page(topo, spec, params, p)  # noqa: E731
            else:
                compute.number(params, "epsilon")
                compute.adversary_field(params)
                topo.require_connected("DECOR accounting")
                work = lambda p: compute.calibrate_decor_page(topo, spec, params, p)  # noqa: E731
        elif kind == "dpsgd":
            compute.dpsgd_settings(params)
            compute.number(params, "noise_multiplier", low=0, low_open=True)
            work = lambda p: compute.dpsgd_page(params, p)  # noqa: E731
        elif kind == "calibrate-dpsgd":
            compute.dpsgd_settings(params)
            compute.number(params, "epsilon", low=0, low_open=True)
            work = lambda p: compute.calibrate_dpsgd_page(params, p)  # noqa: E731
        elif kind == "plan":
            work = lambda p: compute.plan_page(params, p)  # noqa: E731
        else:
            raise ConfigError(
                "kind: expected one of decor, dpsgd, calibrate-decor, calibrate-dpsgd, plan"
            )
        return self.jobs.submit(str(kind), work).view()


class Handler(BaseHTTPRequestHandler):
    """One request; the :class:`App` is the server's ``app`` attribute."""

    server_version = f"privdl-serve/{__version__}"
    quiet = True

    @property
    def app(self) -> App:
        return self.server.app  # type: ignore[attr-defined,no-any-return]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        if not getattr(self.server, "quiet", True):
            super().log_message(format, *args)

    # -- responses
    def _send(self, status: int, body: bytes, content_type: str,
              extra: dict[str, str] | None = None) -> None:  # fmt: skip
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        body = json.dumps(jsonable(obj), allow_nan=False).encode()
        self._send(status, body, "application/json")

    def _body(self) -> dict[str, Any]:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise HttpError(400, "bad Content-Length") from None
        if length > compute.LIMITS["upload_bytes"]:
            self.close_connection = True
            if length <= 8 * compute.LIMITS["upload_bytes"]:  # read it, so the client hears why
                for start in range(0, length, 1 << 16):
                    self.rfile.read(min(1 << 16, length - start))
            raise HttpError(413, f"request of {length:,} bytes; at most "
                                 f"{compute.LIMITS['upload_bytes']:,} are accepted")  # fmt: skip
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            body = json.loads(raw.decode("utf-8") or "{}")
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise HttpError(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise HttpError(400, "the request body must be a JSON object")
        return body

    def _dispatch(self, route: Callable[[], None]) -> None:
        try:
            route()
        except HttpError as exc:
            self._json(exc.status, {"error": str(exc)})
        except Exception as exc:  # the server outlives every request
            message = user_message(exc)
            if message is not None:
                self._json(400, {"error": message})
                return
            traceback.print_exc(file=sys.stderr)
            self._json(500, {"error": f"internal error ({type(exc).__name__}: {exc})"})

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self._dispatch(self._get)

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch(self._post)

    def _get(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path
        if path in ("/", "/index.html"):
            body, ctype = static_file("index.html")
            self._send(200, body, ctype)
        elif path.startswith("/static/"):
            body, ctype = static_file(path.removeprefix("/static/"))
            self._send(200, body, ctype)
        elif path == "/api/limits":
            self._json(200, {"limits": compute.LIMITS, "version": __version__})
        elif path == "/api/graph":
            ref = query.get("graph", "").strip()
            self._json(200, {"graph": ref, "facts": self.app.facts(ref)})
        elif path.startswith("/api/jobs/"):
            parts = path.removeprefix("/api/jobs/").split("/")
            job = self.app.jobs.get(parts[0])
            if job is None:
                raise HttpError(404, f"no such job: {parts[0][:20]!r}")
            if len(parts) == 1:
                self._json(200, job.view())
            elif parts[1:] == ["download"]:
                self._download(job.result, query.get("format", "json"), job.kind, job.id)
            else:
                raise HttpError(404, f"no such route: {path[:80]!r}")
        elif path == "/favicon.ico":
            self._send(204, b"", "image/x-icon")
        else:
            raise HttpError(404, f"no such route: {path[:80]!r}")

    def _download(self, result: dict[str, Any] | None, fmt: str, kind: str, job_id: str) -> None:
        if result is None:
            raise HttpError(409, "this job has no result (not finished, failed or cancelled)")
        name = f"privdl-{kind}-{job_id}"
        if fmt == "json":
            body = (json.dumps(jsonable(result), indent=1, allow_nan=False) + "\n").encode()
            ctype = "application/json"
        elif fmt == "csv":
            body, ctype = to_csv(jsonable(result)).encode(), "text/csv; charset=utf-8"
        else:
            raise HttpError(400, f"format: expected json or csv, got {fmt[:20]!r}")
        self._send(200, body, ctype,
                   {"Content-Disposition": f'attachment; filename="{name}.{fmt}"'})  # fmt: skip

    def _post(self) -> None:
        path = urlsplit(self.path).path
        if path == "/api/upload":
            self._json(200, self.app.upload(self._body()))
        elif path == "/api/jobs":
            self._json(202, self.app.submit(self._body()))
        elif path.startswith("/api/jobs/") and path.endswith("/cancel"):
            job_id = path.removeprefix("/api/jobs/").removesuffix("/cancel")
            job = self.app.jobs.cancel(job_id)
            if job is None:
                raise HttpError(404, f"no such job: {job_id[:20]!r}")
            self._json(200, job.view())
        else:
            raise HttpError(404, f"no such route: {path[:80]!r}")


class Server(ThreadingHTTPServer):
    """A threading HTTP server holding one :class:`App`."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, quiet: bool = True) -> None:
        self.app = App()
        self.quiet = quiet
        super().__init__(address, Handler)


class Server6(Server):
    """The same on an IPv6 address."""

    address_family = socket.AF_INET6


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(host: str = "127.0.0.1", port: int = 0, *, quiet: bool = True) -> Server:
    """A bound (not yet serving) server; port 0 picks a free port (``server.server_address``)."""
    cls = Server6 if ":" in host else Server
    return cls((host, port), quiet=quiet)


def serve_in_thread(host: str = "127.0.0.1", port: int = 0) -> tuple[Server, str]:
    """Start a server on a daemon thread; returns it and its base URL (tests, notebooks)."""
    server = make_server(host, port)
    threading.Thread(target=server.serve_forever, name="privdl-serve", daemon=True).start()
    h, p = server.server_address[:2]
    return server, f"http://{h!s}:{p}"
