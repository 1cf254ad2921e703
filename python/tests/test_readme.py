"""The README's bare Python scheduler is python/examples/bare_scheduler.py, and it runs."""

from __future__ import annotations

import subprocess
import sys

from daemons import REPO

EXAMPLE = REPO / "python" / "examples" / "bare_scheduler.py"


def test_readme_shows_the_example_verbatim():
    readme = (REPO / "README.md").read_text()
    assert EXAMPLE.read_text() in readme


def test_the_example_runs_against_real_daemons(pair):
    out = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            pair.prefill.address,
            pair.decode.address,
            pair.prefill.bootstrap,
            str(pair.prefill.region_dir),
            str(pair.decode.region_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "room 1: SUCCESS, 16384 bytes moved" in out.stdout
