"""``cdr`` in the test's process, as a user runs it with ``--log-format json``: its exit
status and what it printed (the last line is the command's JSON result)."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any


def cdr(*args: str) -> tuple[int, str]:
    """``cdr --log-format json ARGS``: its exit status and its standard output."""
    from pipeline.app.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["--log-format", "json", *args])
    return rc, out.getvalue()


def cdr_json(*args: str) -> tuple[int, dict[str, Any]]:
    """:func:`cdr`, with the result its last line holds (empty when it printed none)."""
    rc, out = cdr(*args)
    lines = out.splitlines()
    return rc, json.loads(lines[-1]) if lines else {}
