"""Passwords of DSNs masked in any text streamlet shows: both libpq forms, passwords holding '@', '/', ':' or
blanks, the client key's password, in messages, failure reasons and log lines."""

from __future__ import annotations

import json

import pytest
import structlog

from streamlet.backends.cluster.tree.lifecycle import JobState, moved, submitted
from streamlet.logs import LogSettings, configure_logging
from streamlet.redaction import redacted, scrub
from tests.support.logging_state import restored_logging

SECRET = "S3cret"

CASES = [
    ("postgresql://app:S3cret@db:5432/shop", "postgresql://app:***@db:5432/shop"),
    ("postgresql://app:p@ss@db/shop", "postgresql://app:***@db/shop"),  # the last '@' ends the user information
    ("postgres://app:a/b:c@db/shop", "postgres://app:***@db/shop"),
    ("postgresql://u@h:1/db?password=S3cret", "postgresql://u@h:1/db?password=***"),
    ("postgresql://u@h/db?sslmode=verify-full&sslpassword=S3cret&x=1",
     "postgresql://u@h/db?sslmode=verify-full&sslpassword=***&x=1"),
    ("POSTGRESQL://u:S3cret@h1:1,h2:2/db?PassWord=S3cret", "POSTGRESQL://u:***@h1:1,h2:2/db?PassWord=***"),
    ("host=db user=app password=S3cret dbname=shop", "host=db user=app password=*** dbname=shop"),
    ("host=db password = 'it\\'s S3cret' dbname=shop", "host=db password = *** dbname=shop"),
    ("host=db sslpassword=S3cret passfile=/home/app/.pgpass", "host=db sslpassword=*** passfile=/home/app/.pgpass"),
    ("postgresql://app@db/shop", "postgresql://app@db/shop"),  # nothing to hide
    ("host=db user=app", "host=db user=app"),
]  # fmt: skip


@pytest.mark.parametrize(("dsn", "shown"), CASES)
def test_every_password_of_a_dsn_is_masked(dsn: str, shown: str) -> None:
    assert redacted(dsn) == shown


def test_a_text_quoting_dsns_keeps_everything_but_their_passwords() -> None:
    """Two DSNs in one message (a repr, a reason in quotes): the rest of the text is untouched, except that a
    bare value runs to the next blank, so punctuation after it goes with it (better a comma hidden than the end
    of a password shown); a word that only ends in 'password' is no parameter."""
    text = (
        "PostgresLookup('postgresql://u:S3cret@h/db', 'select 1') and host=h password=S3cret: "
        "PostgreSQL at postgres://u@h/db?password=S3cret, not reachable; mypassword=kept"
    )
    assert scrub(text) == (
        "PostgresLookup('postgresql://u:***@h/db', 'select 1') and host=h password=*** "
        "PostgreSQL at postgres://u@h/db?password=*** not reachable; mypassword=kept"
    )


def test_a_job_failure_reason_is_recorded_without_the_password() -> None:
    """What the leader writes to the job's state (listed by jobs, cluster status, the dashboard)."""
    state = moved(submitted(0.0), JobState.FAILED, "SinkError: postgresql://u@h:1/db?password=S3cret refused", 0)
    assert state["reason"] == "SinkError: postgresql://u@h:1/db?password=*** refused"


def test_a_log_line_is_written_without_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    """The processes' logs (JSON here): every text of a line, the event and its values, is scrubbed."""
    with restored_logging():
        configure_logging(LogSettings(level="info", format="json"))
        try:
            structlog.get_logger("streamlet.test").warning(
                "connection lost to postgresql://u:S3cret@h/db", error="ConnectionRefusedError: host=h password=S3cret"
            )
        finally:
            structlog.reset_defaults()
    [line] = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert SECRET not in line
    assert (entry["event"], entry["error"]) == (
        "connection lost to postgresql://u:***@h/db",
        "ConnectionRefusedError: host=h password=***",
    )
