"""Fixtures every SGLang test shares.

Each test that builds SGLang's bootstrap server closes it by the end, and
no_bootstrap_server_left holds them to that. The "Task was destroyed but it
is pending! ... CommonKVBootstrapServer._cleanup_expired_entries()" lines
the suite prints at exit do not mean a server was left running: SGLang's
own close() (sglang 0.5.23, disaggregation/common/conn.py) stops the
server's event loop without cancelling the cleanup task it started on it,
so asyncio reports that task whenever a closed server is garbage
collected. During a test pytest's log capture hides the report; the
servers still referenced when the interpreter exits print theirs. Nothing
here silences it: it is SGLang's to fix (cancel the task before stopping
the loop).
"""

from __future__ import annotations

import threading

import pytest

from pdlink.client import wait_for


def _bootstrap_threads() -> list[threading.Thread]:
    # SGLang's bootstrap server runs its aiohttp app on a thread whose target
    # is CommonKVBootstrapServer._run_server (Python names it after the target).
    return [t for t in threading.enumerate() if t.name.endswith("(_run_server)")]


@pytest.fixture(autouse=True)
def no_bootstrap_server_left():
    """Every SGLang bootstrap server a test started is closed by its end."""
    yield
    wait_for(lambda: not _bootstrap_threads(), 10, what="bootstrap servers of the test closed")
