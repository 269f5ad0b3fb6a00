"""How many examples each differential test runs: a few hundred in ``make test``, more in ``make spec``."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: Examples per differential test; ``make spec`` sets ``STREAMLET_SPEC_EXAMPLES`` (thousands).
EXAMPLES = int(os.environ.get("STREAMLET_SPEC_EXAMPLES", "120"))


def examples(share: float = 1.0) -> settings:
    """Hypothesis settings for a differential test running ``share`` of the budget (a slow runner, such as
    ``processes=2``, takes a small share)."""
    return settings(
        max_examples=max(1, int(EXAMPLES * share)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=os.environ.get("STREAMLET_SPEC_EXAMPLES") is None,  # make test: the same examples each run
    )


def capped(examples: int) -> int:
    """``examples``, or fewer under ``STREAMLET_EXAMPLE_CAP`` (make mutation: every surviving mutant runs each
    property test that reaches it, so their budgets are cut there)."""
    cap = os.environ.get("STREAMLET_EXAMPLE_CAP")
    return examples if cap is None else min(examples, int(cap))
