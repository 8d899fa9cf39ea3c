"""A griffe extension for the documentation site (mkdocs.yml): docstrings' ``>>>`` examples become
Python code blocks, which Markdown would otherwise read as nested quotes.

Each run of lines starting with ``>>>`` or ``...`` (with the output lines right after them, up to a
blank line) is fenced as one ```` ```pycon ```` block; the docstrings themselves stay as they are.
"""
from __future__ import annotations

from typing import Any

import griffe


def fence_examples(text: str) -> str:
    """``text`` with each ``>>>`` example fenced (its indentation kept, as in a list item)."""
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if not stripped.startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = lines[i][: len(lines[i]) - len(stripped)]
        block = []
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            block.append(lines[i][len(indent):])
            i += 1
        out += [f"{indent}```pycon", *(indent + line for line in block), f"{indent}```"]
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fence every docstring's ``>>>`` examples as it is loaded."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_examples(obj.docstring.value)
