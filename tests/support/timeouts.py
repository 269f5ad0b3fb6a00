"""pytest-timeout's signal method, made to end a hung test inside an event loop too, with a backstop.

With ``timeout_method = "signal"`` (pyproject) a test that runs past its timeout gets SIGALRM: every stack is
dumped and ``pytest.fail`` is raised in the main thread, so the test fails, its teardown runs (clusters
stopped by PID) and the run goes on. Two things can keep that exception from ending the test, and each is
handled here:

- the main thread runs an event loop (``sl.run``, ``anyio.run``, an async test): the exception may land inside
  a callback or a background task, which asyncio logs or keeps. So the loop is also told to stop: it ends after
  its current turn, and ``run_until_complete`` raises in the test. The loop's tasks' stacks are dumped too.
- the test (or its teardown) still does not end: ``BACKSTOP`` seconds after the timeout, a thread does what
  pytest-timeout's thread method does (dump every stack, ``os._exit(1)``). The reaper
  (``tests/support/reaper.py``) then kills every process the run started.

A plugin (``tests/conftest.py``); ``--timeout-method=thread`` still gives pytest-timeout's own thread method.
"""

from __future__ import annotations

import asyncio
import io
import signal
import threading
import traceback
from types import FrameType
from typing import Any

import pytest
from pytest_timeout import is_debugging, timeout_sigalrm, timeout_timer

BACKSTOP = 60.0  # seconds after the timeout (time for the teardown) before the run is ended whole


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """The signal method as described above; ``None`` (pytest-timeout's own) for any other method, or off the
    main thread."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True
        if not settings.disable_debugger_detection and is_debugging():
            return  # someone is stepping through the test: pytest-timeout leaves it alone too
        _dump_main_thread(item, frame)
        timeout_sigalrm(item, settings)  # the other threads' stacks, then pytest.fail here

    backstop = threading.Timer(settings.timeout + BACKSTOP, timeout_timer, (item, settings))
    backstop.name = f"timeout backstop {item.nodeid}"
    backstop.daemon = True

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        backstop.cancel()
        backstop.join()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # what pytest_timeout_cancel_timer calls
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    backstop.start()
    return True


def _dump_main_thread(item: pytest.Item, frame: FrameType | None) -> None:
    """Write where the main thread was, and the stacks of its event loop's tasks; stop that loop."""
    terminal = item.config.get_terminal_writer()
    terminal.sep("+", title="Timeout: the main thread")
    if frame is not None:
        terminal.write("".join(traceback.format_stack(frame)))
    loop = asyncio._get_running_loop()
    if loop is None:
        return
    for task in asyncio.all_tasks(loop):
        terminal.sep("~", title=f"Task {task.get_name()}")
        stack = io.StringIO()
        task.print_stack(file=stack)
        terminal.write(stack.getvalue())
    loop.stop()  # ends after its current turn: run_until_complete raises, whatever swallows pytest.fail
