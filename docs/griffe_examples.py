"""A Griffe extension for the API reference: streamlet's docstrings as the Google style renders them.

streamlet's docstrings head their doctests ``Example:``; the Google parser knows ``Examples:`` (which it
renders as code), and takes ``Example:`` for an admonition whose doctest lines would be read as Markdown.
They also name objects with Sphinx roles (``:class:`Job```), which Markdown would print as they are.
This rewrites both in the docstring text Griffe loaded; the sources are not changed.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

EXAMPLE = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)
ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj):`~?(?P<name>[^`]+)`")


class StreamletDocstrings(griffe.Extension):
    """``Example:`` read as ``Examples:``; ``:role:`name``` read as ```name```."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is not None:
            text = EXAMPLE.sub(r"\g<indent>Examples:", docstring.value)
            docstring.value = ROLE.sub(r"`\g<name>`", text)
