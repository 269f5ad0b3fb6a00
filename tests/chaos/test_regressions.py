"""Every bug the simulation found, kept as the seed that found it: each now runs clean and ends as it should
(FINISHED; seeds 164 and 3342 STALLED: both copies of the last checkpoint went with lost disks, and they say so).

(seed, workload): what went wrong before the fix."""

from __future__ import annotations

import pytest

from streamlet.testing.chaos import KINDS, WORKLOADS, run_once
from streamlet.testing.chaos.faults import FIRST_KINDS

FOUND = {
    (7, "windows"): "resumed from the checkpoint before the last: a window committed twice",
    (54, "rescale"): "an open of a channel not registered yet closed the connection the restore's answers used",
    (186, "rescale"): "an attempt after the final checkpoint replayed every record: all committed twice",
    (47, "windows"): "a worker restarted before its old session expired vanished when it did: STALLED for ever",
    (66, "rescale"): "an earlier attempt's late epoch begun by the new one: the last 50 records never published",
    (164, "counts"): "a worker restarted mid-attempt rejoined it and the attempt hung",
    (64, "counts"): "a worker restarted on a new port mid-attempt: its peers kept the old one, the attempt hung",
    (146, "rescale"): "a worker that joined by a live change restarted: the attempt hung",
    (193, "rescale"): "a suspended session failed a checkpoint's replication, and the job (FAILED)",
    (4, "shedding"): "a worker taking its node over after an expired session wrote it LIVE at once (VOID -> LIVE)",
    (154, "rescale"): "the worker joining by a live change restarted mid-change: RECONFIGURING for ever",
    (1625, "windows"): "a worker of the attempt lost its registration before the part started: FAILED (KeyError)",
    (1089, "rescale"): "the job's input ran out while a live change began: RECONFIGURING for ever",
    (1185, "rescale"): "the changed task's input ended while the workers wired the change: RECONFIGURING for ever",
    (3020, "poison"): "(the harness) a partition healed for a killed master revived its session: no new leader",
    (3342, "counts"): "every copy of the checkpoint lost: RECOVERING and STALLED in turn every 10 s, for ever",
}
STALLED = {(164, "counts"), (3342, "counts")}  # both copies of the last checkpoint went with lost disks
# found after crash-savepoint joined the kinds: drawn from them all (the seeds above draw from FIRST_KINDS,
# the kinds they were found with, so each keeps its schedule)
FOUND_WITH_EVERY_KIND = {
    (0, "migrate"): "an instance migrated to a worker joining the attempt ran twice there, one never fed: "
    "RUNNING for ever",
    (4893, "rescale"): "a suspended session as a checkpoint's replicas were counted: FAILED (CoordinationError)",
}


CASES = sorted({**FOUND, **FOUND_WITH_EVERY_KIND})


@pytest.mark.parametrize(("seed", "workload"), CASES, ids=[f"{s}-{w}" for s, w in CASES])
def test_a_seed_that_found_a_bug_runs_clean(seed: int, workload: str) -> None:
    kinds = KINDS if (seed, workload) in FOUND_WITH_EVERY_KIND else FIRST_KINDS
    result = run_once(seed, WORKLOADS[workload], kinds=kinds)
    why = FOUND.get((seed, workload)) or FOUND_WITH_EVERY_KIND[seed, workload]
    assert result.violations == [], f"{why}: {result.violations}"
    if (seed, workload) in STALLED:
        assert result.state == "STALLED"
        assert result.reason.startswith("checkpoint ")
        assert "waiting for a worker that holds it" in result.reason
    else:
        assert result.state == "FINISHED"
