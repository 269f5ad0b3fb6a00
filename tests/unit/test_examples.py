"""Every example runs, and gives the exact answer computed without streamlet."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import streamlet as sl
from examples import wordcount

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
