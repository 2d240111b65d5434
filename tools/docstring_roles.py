"""MkDocs hook: show the docstrings' Sphinx roles (``:func:`name```) as plain code.

privdl's docstrings name other objects with Sphinx roles, which mkdocstrings renders literally
(":func:" then the name as code). The role prefix is dropped from the rendered page, leaving
the name in code font.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|attr|data|obj|exc|const):(?=<code>)")


def on_page_content(html: str, *, page: Any, config: Any, files: Any) -> str:
    """Drop the role prefixes before inline code on every page."""
    return ROLE.sub("", html)
