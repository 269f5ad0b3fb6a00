"""MkDocs hooks for streamlet's site (mkdocs.yml, ``hooks:``).

A Python block that the docs test does not run is fenced ```` ```python no-run ````
(tests/unit/test_readme.py); SuperFences takes no option spelt with a hyphen, so the
fence is given to it as a plain Python block titled as not run.
"""

from __future__ import annotations

import re
from typing import Any

NO_RUN = re.compile(r"^(?P<fence>[ \t]*```python)[ \t]+no-run[ \t]*$", re.MULTILINE)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """```` ```python no-run ```` becomes ```` ```python title="not run by the docs test" ````."""
    return NO_RUN.sub(r'\g<fence> title="not run by the docs test"', markdown)
