"""The nemesis's fixed set: two seeded schedules against a real cluster on test hosts, every answer checked.

Seed 1 kills a worker, partitions two workers, loses a worker's disk and cuts a worker from ZooKeeper; seed 18
pauses a worker, kills a ZooKeeper member, cuts a master off from everyone and from ZooKeeper: between them
every fault kind real processes have. ``make nemesis`` runs many more.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamlet.testing.chaos import checker
from streamlet.testing.nemesis import workload
from streamlet.testing.nemesis.runner import KINDS, draw, run_seed
from tests.faults.conftest import KAZOO_TLS_LEAK

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.timeout(240), KAZOO_TLS_LEAK]

FIXED = (1, 18)


def test_the_fixed_seeds_draw_every_fault_kind() -> None:
    assert sorted({fault.kind for seed in FIXED for fault in draw(seed)}) == sorted(KINDS)


@pytest.mark.parametrize(
    "seed", [FIXED[0], pytest.param(FIXED[1], marks=pytest.mark.extended("make extended: a second schedule"))]
)
def test_a_seeded_schedule_leaves_exact_output_and_legal_states(
    seed: int, tmp_path: Path, test_hosts_possible: None
) -> None:
    run = run_seed(seed, tmp_path)
    assert run.violations == [], "\n".join([*run.violations, *map(str, run.faults)])
    assert run.state == "FINISHED", run.reason
    assert run.committed == workload.RECORDS


def test_the_checker_sees_a_count_committed_twice_and_one_lost(tmp_path: Path) -> None:
    """The nemesis's reading of the sink's files and its comparison can fail: one count twice, one missing."""
    records = workload.expected()["out"]
    lines = [json.dumps([record.key, record.value, None]) for record in records]
    (tmp_path / "part-00000001-0000.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # the last one lost
    (tmp_path / "part-00000002-0001.jsonl").write_text(lines[0] + "\n")  # the first one again
    (tmp_path / "0001-00000003.pending").write_text(lines[-1] + "\n")  # staged, never published: not output
    problems = checker.compare_outputs(workload.expected(), workload.committed(tmp_path))
    first, last = records[0], records[-1]
    assert problems == [
        f"sink 'out': {(first.key, first.value)!r} committed 2 times, in-process 1",
        f"sink 'out': {(last.key, last.value)!r} committed 0 times, in-process 1",
    ]


def test_seed_105_a_standby_master_cut_off_past_its_session_campaigns_again(
    tmp_path: Path, test_hosts_possible: None
) -> None:
    """Found by ``make nemesis``: master-1, isolated from ZooKeeper past its session while it waited to lead,
    died on SessionExpiredError raised out of its campaign. Two lost disks leave the job STALLED (both copies
    of a checkpoint gone), which is a legal end: judged once it stalls and both masters campaign again (each
    one's candidate node back), within 30 s of the last heal."""
    run = run_seed(105, tmp_path, bound=30, stalled_ends=True)
    assert run.violations == [], "\n".join([*run.violations, *map(str, run.faults)])
