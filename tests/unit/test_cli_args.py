"""What ``cdr``'s parser asks of a user: no flag that changes nothing."""

from __future__ import annotations

import argparse
import re
from datetime import date

from pipeline.app.cli_args import build_parser
from tests.helpers import REPO


def _subparser(name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def test_cdr_verify_has_one_mode_and_needs_no_flag_for_it():
    """Every check of ``cdr verify`` reads the whole tables: ``--date D`` alone runs them,
    ``--full`` (what the pages once required) is still taken and shown nowhere."""
    args = build_parser().parse_args(["verify", "--date", "2026-11-21"])
    assert args.command == "verify" and args.date == date(2026, 11, 21)
    assert build_parser().parse_args(["verify", "--date", "2026-11-21", "--full"]).full
    assert "--full" not in _subparser("verify").format_help()
    pages = [REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").glob("*.md")]
    code = [*(REPO / "pipeline").rglob("*.py"), *(REPO / "tests").rglob("*.py")]
    said = [
        p.name
        for p in pages + code
        if p.name != "test_cli_args.py" and re.search(r"cdr verify[^\n`]*--full\b", p.read_text())
    ]
    assert not said, f"cdr verify needs no --full: {said}"
