"""Every ```python block of README.md and of docs/**/*.md runs as written, as a whole program, and prints what it shows.

Each block runs in a subprocess of this interpreter, in a scratch directory of
its own, with the repository root on ``PYTHONPATH``. A block whose first line
is ``# continued`` runs after the blocks it continues (the blocks before it
in the same file), as one program. A block
ending in comment lines right after a ``print(...)`` line shows what the
program prints: the whole of stdout must be those lines (of every block of the
program), and stderr must be empty. Blocks fenced ```python no-run are not
run; the text says why above each: at most 3 in the README, at most 5 in the
docs. Every program starts at once, when the first block test asks for them,
so they run side by side. The README stays short (at most 400 lines): the
rest is in docs/, built by ``make docs``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.postgres import fresh_database

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 400
README_MAX_NO_RUN = 3
DOCS_MAX_NO_RUN = 5
CONTINUED = "# continued"
NO_RUN = "no-run"
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    """One ```python block of a markdown text."""

    index: int  # among the python blocks, from 0
    line: int  # line of the opening fence
    code: str  # without the indentation of the fence
    runs: bool  # False when fenced ```python no-run

    @property
    def continued(self) -> bool:
        """The block continues the one before it."""
        return self.code.startswith(CONTINUED + "\n")

    @property
    def title(self) -> str:
        """Its first line that is not ``# continued``."""
        lines = self.code.splitlines()
        return lines[1] if self.continued else lines[0]

    def shown_output(self) -> list[str]:
        """The trailing comment lines after a ``print(...)`` line, without ``# ``; [] when there are none."""
        lines = self.code.rstrip("\n").splitlines()
        end = len(lines)
        while end > 0 and lines[end - 1].startswith("#"):
            end -= 1
        if end == len(lines) or end == 0 or not lines[end - 1].startswith("print("):
            return []
        return [line[2:] if line.startswith("# ") else line[1:] for line in lines[end:]]


def python_blocks(text: str, where: str = "README") -> list[Block]:
    """The ```python blocks of ``text`` (the file ``where``), in order; a tag other than ``no-run`` is an error."""
    blocks: list[Block] = []
    for match in FENCE.finditer(text):
        language, *tags = match["info"].split() or [""]
        if language != "python":
            continue
        line = text.count("\n", 0, match.start()) + 1
        if tags not in ([], [NO_RUN]):
            raise ValueError(f"{where} line {line}: unknown tags {tags} on a python block (only {NO_RUN!r})")
        code = textwrap.dedent(match["body"]) if match["indent"] else match["body"]
        blocks.append(Block(len(blocks), line, code, runs=not tags))
    return blocks


def program(blocks: list[Block], index: int, where: str = "README") -> list[Block]:
    """Block ``index`` and the blocks it continues, first to last; every one of them must run."""
    chain = [blocks[index]]
    while chain[0].continued:
        if chain[0].index == 0:
            raise ValueError(f"{where} line {chain[0].line}: '{CONTINUED}' but no block before it")
        chain.insert(0, blocks[chain[0].index - 1])
    for block in chain:
        if not block.runs:
            raise ValueError(f"{where} line {block.line}: a {NO_RUN} block cannot be continued by a block that runs")
    return chain


def markdown_files() -> list[Path]:
    """README.md, then every page under docs/, in path order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def name_of(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


BLOCKS = {name_of(path): python_blocks(path.read_text(encoding="utf-8"), name_of(path)) for path in markdown_files()}
RUNNABLE = [(where, block) for where, blocks in BLOCKS.items() for block in blocks if block.runs]


@dataclass
class Run:
    """A program of the README or a docs page, started in a subprocess."""

    source: str
    expected: list[str]
    process: subprocess.Popen[str]


POSTGRES_PAGES = {"docs/postgres.md"}  # their blocks get STREAMLET_POSTGRES_DSN: a fresh database each


@pytest.fixture(scope="module")
def started(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[tuple[str, int], Run]]:
    """Every runnable block's program, started at once, each in a scratch directory of its own."""
    base = dict(os.environ)
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [base.get("PYTHONPATH")])])
    runs: dict[tuple[str, int], Run] = {}
    for where, block in RUNNABLE:
        env = base
        if where in POSTGRES_PAGES:  # the session's PostgreSQL server, started only when such a page exists
            env = {**base, "STREAMLET_POSTGRES_DSN": fresh_database(request.getfixturevalue("postgres"))}
        chain = program(BLOCKS[where], block.index, where)
        source = "".join(part.code for part in chain)
        scratch = tmp_path_factory.mktemp(f"block-{re.sub(r'[^a-z0-9]+', '-', where.lower())}-{block.index}")
        (scratch / "cwd").mkdir()
        script = scratch / "block.py"
        script.write_text(source, encoding="utf-8")
        process = subprocess.Popen(
            [sys.executable, str(script)], cwd=scratch / "cwd", env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        runs[where, block.index] = Run(source, [line for part in chain for line in part.shown_output()], process)
    yield runs
    for run in runs.values():
        if run.process.poll() is None:
            run.process.kill()
            run.process.communicate()


@pytest.mark.parametrize(
    ("where", "block"),
    [pytest.param(where, b, id=f"{where}:{b.line}: {b.title[:50]}") for where, b in RUNNABLE],
)
def test_block_runs_and_prints_what_it_shows(where: str, block: Block, started: dict[tuple[str, int], Run]) -> None:
    """The block's program exits 0, prints exactly the lines its comments show, and nothing on stderr."""
    run = started[where, block.index]
    stdout, stderr = run.process.communicate(timeout=60)
    numbered = "\n".join(f"{n:3} {line}" for n, line in enumerate(run.source.splitlines(), 1))
    assert run.process.returncode == 0, (
        f"{where} line {block.line}: exit code {run.process.returncode}\n{stderr}\n--- program:\n{numbered}"
    )
    assert (stdout.splitlines(), stderr) == (run.expected, "")


def test_the_docs_have_python_blocks_and_each_runs_or_says_why_not() -> None:
    """docs/ holds the examples: most of its blocks run; the README keeps one example that runs."""
    in_docs = [block for where, blocks in BLOCKS.items() if where != "README.md" for block in blocks]
    assert len([block for block in in_docs if block.runs]) >= 20
    assert [block.runs for block in BLOCKS["README.md"]].count(True) >= 1


def test_only_blocks_that_need_kafka_or_spark_are_not_run() -> None:
    """The no-run blocks are exactly the Spark and the Kafka example, both in docs/; the limits hold."""
    not_run = [(where, block) for where, blocks in BLOCKS.items() for block in blocks if not block.runs]
    in_readme = [block for where, block in not_run if where == "README.md"]
    in_docs = [block for where, block in not_run if where != "README.md"]
    assert len(in_readme) <= README_MAX_NO_RUN
    assert len(in_docs) <= DOCS_MAX_NO_RUN
    assert [(where, "KafkaSource" in b.code, "SparkSink" in b.code) for where, b in not_run] == [
        ("docs/kafka.md", True, False),
        ("docs/spark.md", False, True),
    ]


def test_the_readme_is_at_most_400_lines() -> None:
    """The README says what streamlet is, the two commands, one example and where to read on; docs/ has the rest."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= README_MAX_LINES


def test_a_continued_block_runs_after_the_block_it_continues() -> None:
    """``# continued`` chains a block to the one before, and the chain shows the output of each part."""
    text = (
        "```python\nx = 1\n```\n\n```sh\nls\n```\n\n"
        f"  ```python\n  {CONTINUED}\n  print(x)\n  # 1\n  ```\n\n"
        f"```python\n{CONTINUED}\nprint(x + 1)\n# 2\n```\n"
    )  # fmt: skip
    chain = program(python_blocks(text), 2)
    assert ("".join(block.code for block in chain), [line for b in chain for line in b.shown_output()]) == (
        "x = 1\n# continued\nprint(x)\n# 1\n# continued\nprint(x + 1)\n# 2\n",
        ["1", "2"],
    )


def test_a_continued_block_first_in_its_file_is_an_error() -> None:
    """A page's first block cannot continue anything: blocks chain within one file only."""
    with pytest.raises(ValueError, match=r"^docs/x\.md line 1: '# continued' but no block before it$"):
        program(python_blocks(f"```python\n{CONTINUED}\nprint(1)\n```\n", "docs/x.md"), 0, "docs/x.md")


def test_readme_quickstart_is_exactly_two_make_commands() -> None:
    """The quickstart block holds `make run` and `make test`, nothing else."""
    text = README.read_text(encoding="utf-8")
    quickstart = text[text.index("## Quickstart") :]
    block = re.search(r"```sh\n(.*?)```", quickstart, re.DOTALL)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
