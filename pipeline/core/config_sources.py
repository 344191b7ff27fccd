"""The replicas' ``source`` settings checked and built (docs/sealing.md): a layout's
``pattern`` and format, a prefix inside the store, tables the config has."""

from __future__ import annotations

from pipeline.core.config_file import ConfigModel, SourceModel
from pipeline.core.config_tables import Problems
from pipeline.core.sources import LAYOUTS, Source, pattern_problem


def _folder_problem(text: str) -> str | None:
    if "://" in text or text.startswith("/") or "\\" in text:
        return f"{text!r} is a folder of the store (e.g. cdc/pg1), not a URI or an absolute path"
    if ".." in text.split("/"):
        return f"{text!r} leaves the store's folder ('..')"
    return None


def _source(s: SourceModel, tables: set[str], where: str, p: Problems) -> Source | None:
    rule = LAYOUTS[s.layout]
    before = len(p.items)
    if (why := _folder_problem(s.prefix)) is not None:
        p.add(f"{where}.prefix", why)
    if rule.pattern and s.pattern is None:
        p.add(f"{where}.pattern", f"layout {s.layout} needs a pattern, e.g. 'slot-{{date}}.json'")
    if not rule.pattern and s.pattern is not None:
        p.add(f"{where}.pattern", f"layout {s.layout} names its objects itself: no pattern")
    if s.pattern is not None and (why := pattern_problem(s.pattern)) is not None:
        p.add(f"{where}.pattern", why)
    if rule.format is None and s.format is None:
        p.add(f"{where}.format", f"layout {s.layout} needs the format of its files")
    if rule.format is not None and s.format not in (None, rule.format):
        p.add(f"{where}.format", f"layout {s.layout} writes {rule.format}, not {s.format!r}")
    for t, folder in s.tables.items():
        if t not in tables:
            p.add(f"{where}.tables.{t}", f"no table {t!r} (tables: {', '.join(sorted(tables))})")
        if (why := _folder_problem(folder)) is not None:
            p.add(f"{where}.tables.{t}", why)
    if len(p.items) > before:
        return None
    fmt = rule.format or s.format
    assert fmt is not None
    return Source(
        s.prefix.strip("/"),
        s.layout,
        fmt,
        dict(s.options),
        {t: f.strip("/") for t, f in s.tables.items()},
        s.pattern,
        s.field,
        s.grace_hours,
    )


def resolve_sources(m: ConfigModel, p: Problems) -> dict[str, Source]:
    """Each replica's source, by replica id (the replicas without one left out)."""
    out = {}
    for i, r in enumerate(m.replicas):
        if r.source is not None:
            built = _source(r.source, set(m.tables), f"replicas[{i}].source", p)
            if built is not None:
                out[r.id] = built
    return out
