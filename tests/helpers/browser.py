"""Pages as a browser shows them: Debian's Chromium, headless (``make browser`` installs
it), renders a page and runs its scripts; the DOM it leaves, and a screenshot."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path


def chromium() -> str:
    """Debian's Chromium (``make test`` installs it when missing)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Chromium is missing: `make browser` installs Debian's chromium package"
    return exe


def render(page: Path, tmp: Path) -> str:
    """The DOM of ``page`` after Chromium rendered it headless; a screenshot beside it."""
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp / 'chromium-profile'}",
    ]
    flags.append("--virtual-time-budget=10000")  # let the page's scripts build its tables
    shot = tmp / f"{page.stem}.png"
    subprocess.run(
        [chromium(), *flags, f"--screenshot={shot}", "--window-size=1280,900", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
    dom = subprocess.run(
        [chromium(), *flags, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)  # what the page shows
