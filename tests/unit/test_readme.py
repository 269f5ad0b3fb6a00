"""Every ```python block of README.md runs as written, as a whole program, and prints what it shows.

Each block runs in a subprocess of this interpreter, in a scratch directory of
its own, with the repository root on ``PYTHONPATH``. A block whose first line
is ``# continued`` runs after the blocks it continues, as one program. A block
ending in comment lines right after a ``print(...)`` line shows what the
program prints: the whole of stdout must be those lines (of every block of the
program), and stderr must be empty. Blocks fenced ```python no-run are not
run; the README says why above each. Every program starts at once, when the
first block test asks for them, so they run side by side.
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

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
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


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text``, in order; any other tag after ``python`` than ``no-run`` is an error."""
    blocks: list[Block] = []
    for match in FENCE.finditer(text):
        language, *tags = match["info"].split() or [""]
        if language != "python":
            continue
        line = text.count("\n", 0, match.start()) + 1
        if tags not in ([], [NO_RUN]):
            raise ValueError(f"README line {line}: unknown tags {tags} on a python block (only {NO_RUN!r})")
        code = textwrap.dedent(match["body"]) if match["indent"] else match["body"]
        blocks.append(Block(len(blocks), line, code, runs=not tags))
    return blocks


def program(blocks: list[Block], index: int) -> list[Block]:
    """Block ``index`` and the blocks it continues, first to last; every one of them must run."""
    chain = [blocks[index]]
    while chain[0].continued:
        if chain[0].index == 0:
            raise ValueError(f"README line {chain[0].line}: '{CONTINUED}' but no block before it")
        chain.insert(0, blocks[chain[0].index - 1])
    for block in chain:
        if not block.runs:
            raise ValueError(f"README line {block.line}: a {NO_RUN} block cannot be continued by a block that runs")
    return chain


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))
RUNNABLE = [block for block in BLOCKS if block.runs]


@dataclass
class Run:
    """A README program started in a subprocess."""

    source: str
    expected: list[str]
    process: subprocess.Popen[str]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Run]]:
    """Every runnable block's program, started at once, each in a scratch directory of its own."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    runs: dict[int, Run] = {}
    for block in RUNNABLE:
        chain = program(BLOCKS, block.index)
        source = "".join(part.code for part in chain)
        scratch = tmp_path_factory.mktemp(f"readme-block-{block.index}")
        (scratch / "cwd").mkdir()
        script = scratch / "block.py"
        script.write_text(source, encoding="utf-8")
        process = subprocess.Popen(
            [sys.executable, str(script)], cwd=scratch / "cwd", env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        runs[block.index] = Run(source, [line for part in chain for line in part.shown_output()], process)
    yield runs
    for run in runs.values():
        if run.process.poll() is None:
            run.process.kill()
            run.process.communicate()


@pytest.mark.parametrize("block", [pytest.param(b, id=f"{b.index}-line{b.line}: {b.title[:50]}") for b in RUNNABLE])
def test_readme_block_runs_and_prints_what_it_shows(block: Block, started: dict[int, Run]) -> None:
    """The block's program exits 0, prints exactly the lines its comments show, and nothing on stderr."""
    run = started[block.index]
    stdout, stderr = run.process.communicate(timeout=60)
    numbered = "\n".join(f"{n:3} {line}" for n, line in enumerate(run.source.splitlines(), 1))
    assert run.process.returncode == 0, f"exit code {run.process.returncode}\n{stderr}\n--- program:\n{numbered}"
    assert (stdout.splitlines(), stderr) == (run.expected, "")


def test_only_blocks_that_need_kafka_or_spark_are_not_run() -> None:
    """The no-run blocks are exactly the Kafka and the Spark example."""
    not_run = [block for block in BLOCKS if not block.runs]
    assert [("KafkaSource" in b.code, "SparkSink" in b.code) for b in not_run] == [(False, True), (True, False)]


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


def test_readme_quickstart_is_exactly_two_make_commands() -> None:
    """The quickstart block holds `make run` and `make test`, nothing else."""
    text = README.read_text(encoding="utf-8")
    quickstart = text[text.index("## Quickstart") :]
    block = re.search(r"```sh\n(.*?)```", quickstart, re.DOTALL)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
