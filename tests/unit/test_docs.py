"""The user's documentation holds together: every relative link of ``README.md``,
``CONTRIBUTING.md`` and ``docs/`` names a file of the repository and, with ``#anchor``, a
heading (or an ``<a id>``) of it, as GitHub renders them; every ``docs/<page>.md#anchor``
a docstring or comment of the code cites exists; and nothing cites a document the
repository does not hold."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
CODE = sorted(
    p
    for top in ("pipeline", "dags", "plugins", "tests", "bench")
    for p in (REPO / top).rglob("*.py")
    if "__pycache__" not in p.parts
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"\bdocs/([\w-]+\.md)(?:#([\w-]+))?")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    kept, fence = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    fence = False
    for line in page.read_text().split("\n"):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        if m := re.match(r"^#{1,6}\s+(.*)$", line):
            s = slug(m[1])
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
        out.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
    return frozenset(out)


def test_slug_follows_github():
    assert slug("Tombstones and `gc_grace_seconds`") == "tombstones-and-gc_grace_seconds"
    assert slug("What-if") == "what-if"
    assert slug("The JVM's start") == "the-jvms-start"
    assert slug("`cdr run --date D --then-later`") == "cdr-run---date-d---then-later"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path):
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no {path}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, broken


def test_every_page_is_linked_from_the_readme_or_another_page():
    linked = {
        (p.parent / t.partition("#")[0]).resolve()
        for p in PAGES
        for t in LINK.findall(_prose(p.read_text()))
        if not re.match(r"^[a-z]+:", t) and t.partition("#")[0]
    }
    assert not [p.name for p in PAGES[1:] if p.resolve() not in linked]


def test_every_page_the_code_cites_exists_with_its_anchor():
    broken = []
    for p in CODE:
        for page, anchor in CITED.findall(p.read_text()):
            dest = REPO / "docs" / page
            if not dest.exists() or (anchor and anchor not in anchors(dest)):
                broken.append(f"{p.relative_to(REPO)}: docs/{page}#{anchor}")
    assert not broken, sorted(set(broken))


#: the internal contract's files, which the repository does not hold
OUTSIDE = re.compile(
    r"\b(semantics|formats|extensions)\.md\b|(?<!docs/)\bcdc\.md\b|§\d|\.\./shared"
)


def test_nothing_cites_a_document_outside_the_repository():
    """The pages, docstrings and comments cite ``docs/``; the one allowed mention of the
    folder beside the checkout is where the scenarios are found by default."""
    allowed = {REPO / "tests" / "helpers" / "scenarios.py"}
    found = [
        f"{p.relative_to(REPO)}:{n}"
        for p in [*PAGES, *CODE]
        if p not in allowed and p != Path(__file__)
        for n, line in enumerate(p.read_text().split("\n"), 1)
        if OUTSIDE.search(re.sub(r"https?://\S+", "", line))
    ]
    assert not found, found


def test_the_checker_finds_a_broken_anchor(tmp_path: Path):
    page = tmp_path / "a.md"
    page.write_text("# Title\n\n## `policy: postgres`\n")
    assert "policy-postgres" in anchors(page)
    assert "policy-delete_wins" not in anchors(page)


#: paths a page names that exist only in the wheel or once fetched
NOT_IN_CHECKOUT = {"pipeline/expectations/", "pipeline/validate/assets/"}


def test_every_file_a_page_names_is_in_the_repository():
    tops = "pipeline|tests|bench|dags|plugins|docker"
    named = re.compile(rf"(?<![\w/])((?:{tops})/[\w/.-]*\w(?:\.\w+|/))")
    missing = sorted(
        f"{page.relative_to(REPO)}: {path}"
        for page in PAGES
        for path in set(named.findall(page.read_text()))
        if path not in NOT_IN_CHECKOUT and not (REPO / path).exists()
    )
    assert not missing, missing
