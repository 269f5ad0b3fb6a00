"""The README's example runs and prints what the README says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_example_prints_its_documented_output() -> None:
    """The first python block, executed, prints the line shown in its last comment."""
    block = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert block is not None
    code = block.group(1)
    expected = re.findall(r"^# (.*)$", code, re.MULTILINE)[-1]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
    assert printed.getvalue().strip() == expected


def test_readme_quickstart_is_exactly_two_make_commands() -> None:
    """The quickstart block holds `make run` and `make test`, nothing else."""
    text = README.read_text(encoding="utf-8")
    quickstart = text[text.index("## Quickstart") :]
    block = re.search(r"```sh\n(.*?)```", quickstart, re.DOTALL)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
