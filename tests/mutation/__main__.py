"""Print the mutation score of each module ``mutmut run`` mutated, from the results it left under ``mutants/``.

A mutant is killed when its tests failed (or timed out); a survivor listed in ``equivalent.toml`` with a
reason (a change no test can see: the same answer by another path) counts as neither. The score is
killed / (mutants - equivalent); ``--at-least`` makes the command fail when a module scores below it.

    python -m tests.mutation --at-least 0.9
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections import Counter
from pathlib import Path

KILLED = {1, 3, 36, 24, -24, 152, 255}  # failed, pytest's internal error, or timed out (mutmut's codes)
HERE = Path(__file__).parent


def equivalent() -> dict[str, str]:
    """Surviving mutants judged equivalent, by mutmut's name, with the reason."""
    path = HERE / "equivalent.toml"
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def scores(mutants: Path, reasons: dict[str, str]) -> dict[str, dict[str, object]]:
    """Per mutated module: its counts, score and survivors (those not judged equivalent)."""
    found: dict[str, dict[str, object]] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        module = str(meta.relative_to(mutants)).removesuffix(".meta")
        codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        counts: Counter[str] = Counter()
        survivors = []
        for name, code in codes.items():
            if name in reasons:
                counts["equivalent"] += 1
            elif code in KILLED:
                counts["killed"] += 1
            elif code is None:
                counts["not checked"] += 1  # the run was cut short
            else:
                counts["survived" if code == 0 else "no tests" if code in (5, 33) else f"exit {code}"] += 1
                survivors.append(name)
        judged = len(codes) - counts["equivalent"]
        score = counts["killed"] / judged if judged else 1.0
        found[module] = {"mutants": len(codes), **counts, "score": round(score, 3), "survivors": survivors}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutants", type=Path, default=Path("mutants"))
    parser.add_argument("--at-least", type=float, default=0.0, help="fail when a module scores below this")
    parser.add_argument("--survivors", action="store_true", help="list each module's surviving mutants")
    options = parser.parse_args()
    found = scores(options.mutants, equivalent())
    if not found:
        print(f"no mutmut results under {options.mutants}/: run `mutmut run` first", file=sys.stderr)
        return 2
    for module, result in found.items():
        survivors = result.pop("survivors")
        print(json.dumps({"module": module, **result}))
        if options.survivors:
            for name in survivors:  # type: ignore[attr-defined]
                print(f"    {name}")
    below = [module for module, result in found.items() if float(result["score"]) < options.at_least]  # type: ignore[arg-type]
    if below:
        print(f"below {options.at_least:.0%}: {', '.join(below)}", file=sys.stderr)
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
