"""The docs stay true: the Python client page's bare scheduler is
python/examples/bare_scheduler.py and it runs; no relative link is dead."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from daemons import REPO

EXAMPLE = REPO / "python" / "examples" / "bare_scheduler.py"
CLIENT_PAGE = REPO / "docs" / "python-client.md"

# [text](target) outside code; images too. Targets with a scheme are not ours.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~)")


def markdown_files() -> list[Path]:
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "*.md"], capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / p for p in tracked]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def dead_links(page: Path) -> list[str]:
    dead, fenced = [], False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in _LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}:{n}: {target}"
            if not dest.exists():
                dead.append(where + " (no such file)")
            elif REPO not in dest.parents and dest != REPO:
                dead.append(where + " (leaves the repository)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                dead.append(where + " (no such heading)")
    return dead


def test_no_relative_link_is_dead_or_leaves_the_repository():
    pages = markdown_files()
    assert REPO / "README.md" in pages and CLIENT_PAGE in pages
    dead = [d for p in pages for d in dead_links(p)]
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_the_link_check_finds_a_dead_link(tmp_path, monkeypatch):
    page = REPO / "docs" / "_probe.md"
    page.write_text("[gone](nowhere.md) [ok](design.md) [no heading](design.md#no-such) `[x](y)`\n")
    try:
        found = dead_links(page)
    finally:
        page.unlink()
    assert len(found) == 2 and "nowhere.md" in found[0] and "no such heading" in found[1]


def test_the_client_page_shows_the_example_verbatim():
    assert EXAMPLE.read_text() in CLIENT_PAGE.read_text()


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
