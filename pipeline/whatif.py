"""extensions.md E8: what another configuration would have made of a published night.

``cdr whatif --config other.yaml --date D`` resolves the inputs of D's published run (the
same exports, the state of the date before D, the run's clock) under ``other.yaml``, as a
dry run that publishes nothing, and compares, per table:

- the snapshot: rows that differ (in a column a reader sees, or present on one side
  only), with their keys and a sample of both versions;
- conflicts by type and outcome, divergent keys per replica and orphans, side by side.

The comparison goes to ``published/reports/dt=<D>/whatif/<name>.json`` and an HTML page
beside it (``name``: the config file's stem). The published side is D's ``state``
partition (its live rows are D's snapshot, even once a later date moved the snapshot on).
Both snapshots are compared on the driver (pyarrow): fine for the tables of a night's
review; a table of tens of millions of rows wants a Spark join here.
"""

from __future__ import annotations

import html
import json
import logging
import uuid
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import layout
from pipeline.config import Config, Table
from pipeline.errors import StageError
from pipeline.jsonvalues import dumps
from pipeline.lake import Lake
from pipeline.runs_table import published_by_date, read_runs
from pipeline.store import open_store
from pipeline.summary import RunSummary
from pipeline.workpath import WorkPath, read_folder

log = logging.getLogger(__name__)

SAMPLE = 20  # differing rows shown with both versions
MAX_KEYS = 10_000  # differing keys listed per table


def report_key(dt: date, name: str, ext: str = "json") -> str:
    return f"{layout.report_dir(dt)}/whatif/{name}.{ext}"


def whatif(
    config: Config, dt: date, name: str, work_dir: WorkPath | Path, master: str | None = None
) -> dict[str, Any]:
    """Resolve D's published inputs under ``config``, compare, write the JSON and HTML
    into the store; returns the comparison."""
    from pipeline import stages
    from pipeline.spark import get_spark

    assert config.store
    store = open_store(config.store)
    lake = Lake(store)
    run = published_by_date(read_runs(lake)).get(dt)
    if run is None:
        raise StageError(f"no published run of {dt} in {config.store}: nothing to compare with")
    report = json.loads(store.read_bytes(layout.run_report(dt, run.run_id)))
    now = datetime.fromtimestamp(report["now_us"] / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    opts = stages.RunOptions(
        work_dir,
        now=now,
        run_id=f"whatif-{name}-{uuid.uuid4().hex[:8]}",
        dry_run=True,  # nothing of it reaches the store but the comparison
        data_docs=False,
        accept_late_exports=True,
        allow_missing_exports=True,
        master=master,
    )
    ctx = stages.ingest(config, dt, opts)
    try:
        spark = get_spark(master, small=stages.small_run(ctx))
        summary = stages.resolve(config, ctx, spark)
    finally:
        stages.finish(config, ctx)
    staged = {m["manifest"]: m["sha256"] for s in _inputs(ctx) for m in s}
    published = {m["manifest"]: m["sha256"] for m in run.inputs if m.get("table") in config.tables}
    result = {
        "name": name,
        "dt": dt.isoformat(),
        "published_run_id": run.run_id,
        "whatif_run_id": ctx.run_id,
        "same_exports": staged == published if published else None,
        "tables": {
            t: compare_table(
                table, report["tables"].get(t, {}), lake, dt, ctx.resolved / t, summary
            )
            for t, table in config.tables.items()
        },
    }
    body = json.dumps(result, indent=1, default=str).encode()
    store.write_bytes(report_key(dt, name), body)
    store.write_bytes(report_key(dt, name, "html"), render(result).encode())
    log.info("whatif %s for %s: %s", name, dt, store.uri + "/" + report_key(dt, name))
    return result


def _inputs(ctx: Any) -> list[list[dict[str, Any]]]:
    from pipeline.exports import load_inputs

    return [s.manifests for s in load_inputs(ctx).values()]


def _rows(t: pa.Table | None, table: Table) -> dict[str, dict[str, Any]]:
    """Rows by their key (as JSON), with the columns a reader sees."""
    if t is None or t.num_rows == 0:
        return {}
    t = t.select(list(table.column_names))
    return {dumps({c: r[c] for c in table.key}): r for r in t.to_pylist()}


def compare_table(
    table: Table,
    published: dict[str, Any],
    lake: Lake,
    dt: date,
    resolved: WorkPath,
    summary: RunSummary,
) -> dict[str, Any]:
    state = lake.read(layout.table_path(table.name, layout.STATE), dt=dt)
    if state is not None:
        state = state.filter(pc.invert(pc.fill_null(state["_deleted"], False)))
    mine = read_folder(resolved / layout.SNAPSHOT)
    cols = list(table.column_names)
    if mine is not None and state is not None:  # compared as values of the same types
        mine = mine.select(cols).cast(state.select(cols).schema)
    before, after = _rows(state, table), _rows(mine, table)
    differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    s = summary.tables.get(table.name)
    what = {
        "conflicts": s.conflicts if s else {},
        "divergent_keys": s.divergent_keys if s else {},
        "orphans": s.orphans if s else 0,
        "quarantined": s.quarantined if s else {},
    }
    return {
        "rows": {"published": len(before), "whatif": len(after)},
        "differing_rows": {
            "count": len(differ),
            "keys": [json.loads(k) for k in differ[:MAX_KEYS]],
            "keys_truncated": len(differ) > MAX_KEYS,
            "sample": [
                {"key": json.loads(k), "published": before.get(k), "whatif": after.get(k)}
                for k in differ[:SAMPLE]
            ],
        },
        **{
            k: {"published": published.get(k, {} if k != "orphans" else 0), "whatif": v}
            for k, v in what.items()
        },
    }


# ---------------------------------------------------------------------- the page


def _e(v: Any) -> str:
    return html.escape(v if isinstance(v, str) else json.dumps(v, default=str))


def _side_by_side(title: str, pub: dict[str, Any], mine: dict[str, Any]) -> str:
    """Nested counts (a conflict type's outcomes, or a flat mapping) as rows of both."""

    def flat(d: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k, v in d.items():
            for k2, n in v.items() if isinstance(v, dict) else [("", v)]:
                out[f"{k} {k2}".strip()] = n
        return out

    a, b = flat(pub), flat(mine)
    rows = (
        "".join(
            f"<tr><td>{_e(k)}</td><td class=n>{_e(a.get(k, 0))}</td>"
            f"<td class=n>{_e(b.get(k, 0))}</td></tr>"
            for k in sorted(a.keys() | b.keys())
        )
        or "<tr><td colspan=3 class=muted>none</td></tr>"
    )
    return (
        f"<h3>{_e(title)}</h3><table><tr><th></th><th>published</th><th>what-if</th></tr>"
        f"{rows}</table>"
    )


def render(result: dict[str, Any]) -> str:
    parts = [
        f"<h1>What-if {_e(result['name'])} for {_e(result['dt'])}</h1>",
        f"<p class=muted>published run {_e(result['published_run_id'])}; what-if run "
        f"{_e(result['whatif_run_id'])}; the same exports: {_e(result['same_exports'])}</p>",
    ]
    for t, c in result["tables"].items():
        d = c["differing_rows"]
        parts.append(
            f"<h2 id='table-{_e(t)}'>{_e(t)}</h2><p>rows: {c['rows']['published']} published, "
            f"{c['rows']['whatif']} what-if; <b>{d['count']}</b> differ</p>"
        )
        sample = "".join(
            f"<tr><td>{_e(x['key'])}</td><td>{_e(x['published'])}</td><td>{_e(x['whatif'])}</td></tr>"
            for x in d["sample"]
        )
        if sample:
            parts.append(
                "<table class=sample><tr><th>key</th><th>published</th><th>what-if</th></tr>"
                f"{sample}</table>"
            )
        for k in ("conflicts", "divergent_keys", "quarantined"):
            parts.append(_side_by_side(k.replace("_", " "), c[k]["published"], c[k]["whatif"]))
        parts.append(
            _side_by_side(
                "orphans",
                {"orphans": c["orphans"]["published"]},
                {"orphans": c["orphans"]["whatif"]},
            )
        )
    style = (
        "body{font-family:system-ui,sans-serif;margin:1.5rem}table{border-collapse:collapse}"
        "td,th{border:1px solid #ddd;padding:.2rem .5rem}.n{text-align:right}.muted{color:#666}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>What-if {_e(result['name'])}"
        f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>"
    )
