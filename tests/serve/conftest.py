"""The ``base_url`` fixture: a ``privdl serve`` server on a free loopback port."""

from __future__ import annotations

import pytest

from privdl.serve.app import serve_in_thread


@pytest.fixture(scope="module")
def base_url():
    server, url = serve_in_thread("127.0.0.1", 0)
    yield url
    server.shutdown()
    server.server_close()
