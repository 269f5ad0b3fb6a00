"""Every example runs, and gives the exact answer computed without streamlet."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import streamlet as sl
from examples import wordcount
from tests.support import run_output

ROOT = Path(__file__).resolve().parents[2]


def expected_counts(path: Path) -> Counter[str]:
    return Counter(re.findall(r"[a-z']+", path.read_text(encoding="utf-8").lower()))


def test_wordcount_counts_the_bundled_text_exactly() -> None:
    """The parallel word count equals a plain Counter over the same text."""
    result = sl.run(wordcount.build_topology())
    assert wordcount.word_counts(result) == expected_counts(wordcount.BUNDLED_TEXT)
    assert result.statistics.nodes["split"].parallelism == 2


def test_wordcount_on_a_given_file(tmp_path: Path) -> None:
    """A path on the command line is counted instead of the bundled text."""
    text = tmp_path / "text.txt"
    text.write_text("b a b\nc b\n\na\n", encoding="utf-8")
    result = sl.run(wordcount.build_topology(text, parallelism=3))
    assert wordcount.word_counts(result) == {"a": 2, "b": 3, "c": 1}


def test_wordcount_script_prints_the_top_words(tmp_path: Path) -> None:
    """``python examples/wordcount.py FILE`` prints totals, most frequent first."""
    text = tmp_path / "text.txt"
    text.write_text("b a b\nc b\na\n", encoding="utf-8")
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "wordcount.py"), str(text)],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    lines = run.stdout.splitlines()
    assert re.fullmatch(r"6 words, 3 distinct, in \d+\.\d ms", lines[0])
    assert [line.split() for line in lines[1:]] == [["3", "b"], ["2", "a"], ["1", "c"]]


def test_merge_ports_script_prints_matches() -> None:
    """``python examples/merge_ports.py`` prints one line per order."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "merge_ports.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert run.stdout.splitlines() == ["o1 paid", "o2 paid", "o3 paid", "o4 mismatch"]


# -- every example under `streamlet run` ------------------------------------------------------------------------

EXAMPLES = sorted(path.name for path in (ROOT / "examples").glob("*.py") if path.name != "__init__.py")
#: Examples that need Java and Spark: their `streamlet run` test is with the other Spark tests.
RUN_ELSEWHERE = {"sensor_pipeline.py": "tests/integration/test_spark_flagship_cli.py"}


def streamlet_run(example: str, *options: str) -> subprocess.CompletedProcess[str]:
    """``streamlet run examples/<example> OPTIONS`` in a subprocess, as a user types it, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "streamlet", "run", f"examples/{example}", *options],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def check_wordcount() -> None:
    """Most frequent words first (ties by word), five of them; the counts per node follow from the text."""
    run = streamlet_run("wordcount.py", "--sort", "-value", "--rows", "5")
    assert (run.returncode, run.stderr) == (0, "")
    counts = expected_counts(wordcount.BUNDLED_TEXT)
    top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:5]
    assert run_output.rows(run.stdout, "sink 'totals'") == [[word, str(total), "None"] for word, total in top]
    assert [row[:2] for row in run_output.rows(run.stdout, "sink 'totals'")] == [
        ["the", "32"], ["and", "10"], ["it", "9"], ["river", "8"], ["is", "6"],
    ]  # fmt: skip
    assert run_output.caption(run.stdout, "totals") == f"showing 5 of {len(counts)} records"
    lines, words, distinct = len(wordcount.BUNDLED_TEXT.read_text().splitlines()), sum(counts.values()), len(counts)
    assert run_output.node_rows(run.stdout, "wordcount") == [
        ["lines", "source", "1", str(lines), str(lines), "0"],
        ["split", "task", "2", str(lines), str(words), "0"],
        ["count", "task", "2", str(words), str(distinct), "0"],
        ["totals", "sink", "1", str(distinct), "-", "0"],
    ]
    assert run.stdout.splitlines()[-2:-1] == [run_output.COUNTERS_ZERO]
    assert run_output.TIMING.fullmatch(run.stdout.splitlines()[-1])


def check_merge_ports() -> None:
    """Both sinks get every match, by order id; 8 records in (4 + 4), 4 matches out."""
    run = streamlet_run("merge_ports.py", "--sort", "key")
    assert (run.returncode, run.stderr) == (0, "")
    for sink in ("ledger", "audit"):
        shown = run_output.rows(run.stdout, f"sink '{sink}'")
        assert [row[:2] for row in shown] == [["o1", "paid"], ["o2", "paid"], ["o3", "paid"], ["o4", "mismatch"]]
        assert all(re.fullmatch(r"\d+\.\d+", row[2]) for row in shown)  # the source's clock time
        assert run_output.caption(run.stdout, sink) == "showing 4 of 4 records"
    assert run_output.node_rows(run.stdout, "merge-ports") == [
        ["orders", "source", "1", "4", "4", "0"],
        ["payments", "source", "1", "4", "4", "0"],
        ["match", "task", "1", "8", "4", "0"],
        ["ledger", "sink", "1", "4", "-", "0"],
        ["audit", "sink", "1", "4", "-", "0"],
    ]
    assert run_output.TIMING.fullmatch(run.stdout.splitlines()[-1])


RUN_CHECKS = {"wordcount.py": check_wordcount, "merge_ports.py": check_merge_ports}


def test_every_example_has_a_streamlet_run_test() -> None:
    """A new example fails this until its `streamlet run` output is checked here (or with the Spark tests)."""
    assert sorted([*RUN_CHECKS, *RUN_ELSEWHERE]) == EXAMPLES
    for example, test in RUN_ELSEWHERE.items():
        assert f'"examples/{example}"' in (ROOT / test).read_text(encoding="utf-8")


@pytest.mark.parametrize("example", sorted(RUN_CHECKS))
def test_example_under_streamlet_run_shows_its_results(example: str) -> None:
    """``streamlet run examples/<example>`` exits 0 and prints the records and counts the example stands for."""
    RUN_CHECKS[example]()
