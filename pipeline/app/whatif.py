"""docs/operations.md#what-if: what another configuration would have made of a published night.

``cdr whatif --config other.yaml --date D`` resolves the inputs of D's published run (the
same exports, the state of the date before D, the run's clock) under ``other.yaml``, as a
dry run that publishes nothing, and compares, per table:

- the snapshot: rows that differ (in a column a reader sees, or present on one side
  only), with their keys and a sample of both versions;
- conflicts by type and outcome, divergent keys per replica and orphans, side by side.

The comparison goes to ``published/reports/dt=<D>/whatif/<name>.json`` and an HTML page
beside it (``name``: the config file's stem). The published side is the live rows of the
state D's ``runs`` row names (D's snapshot, even once a later date moved the snapshot
on), read by the executors through Delta and checked as a run's prior is
(``prior.pin_state``); a Spark join on the key compares it with the what-if snapshot, and
only the counts and the first differing rows reach the driver.
"""

from __future__ import annotations

import html
import json
import logging
import re
import uuid
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from pipeline import stages
from pipeline.core import layout
from pipeline.core.columns import DT, KEY, STATE_DELETED
from pipeline.core.config import WHATIF_NAME, Config, Table
from pipeline.core.errors import ConfigError, StageError
from pipeline.core.report import RunReport
from pipeline.core.summary import RunSummary, TableSummary
from pipeline.ingest.inputs import load_inputs
from pipeline.ingest.prior import pin_state, state_path
from pipeline.resolve.state import empty_state
from pipeline.spark.session import get_spark
from pipeline.storage.lake import Lake
from pipeline.storage.lake_read import read_pinned
from pipeline.storage.outputs import output_record, read_output
from pipeline.storage.runs_table import RunRow, published_by_date, read_runs
from pipeline.storage.store import Store, open_store
from pipeline.storage.workpath import WorkPath

log = logging.getLogger(__name__)

SAMPLE = 20  # differing rows shown with both versions
#: the join's own columns (named apart from any column of a table)
PUB, MINE, DIFFER = "__cdr_published", "__cdr_whatif", "__cdr_differ"
MAX_KEYS = 10_000  # differing keys listed per table


MAIN = "main"  # the what-if form's name of the main DAG's config


def config_named(name: str, main: Path, folder: Path) -> Path:
    """The config a what-if from the UI runs: ``main`` is the main DAG's (``main``); any
    other name is ``<name>.yaml`` in the what-if ``folder`` (``CDR_WHATIF_DIR``). A path,
    or a name that is not one of these, is refused before anything is read: a form must
    not tell which files a worker holds, nor quote them into a task's log."""

    if not isinstance(name, str) or not re.fullmatch(WHATIF_NAME, name):
        given = name[:80] if isinstance(name, str) else repr(name)
        raise ConfigError(
            "what-if config",
            [
                f"{given!r} is not a name: give '{MAIN}' (the main DAG's config) or the name "
                "of a .yaml file in the what-if folder (CDR_WHATIF_DIR), without a path or "
                "a suffix"
            ],
        )
    if name == MAIN:
        return main
    path = folder / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError("what-if config", [f"'{name}': no {name}.yaml in the what-if folder"])
    return path


def report_key(dt: date, name: str, ext: str = "json") -> str:
    return f"{layout.report_dir(dt)}/whatif/{name}.{ext}"


def whatif(
    config: Config, dt: date, name: str, work_dir: WorkPath | Path, master: str | None = None
) -> dict[str, Any]:
    """Resolve D's published inputs under ``config``, compare, write the JSON and HTML
    into the store; returns the comparison."""

    assert config.store
    store = open_store(config.store)
    lake = Lake(store)
    runs = read_runs(lake)
    run = published_by_date(runs).get(dt)
    if run is None:
        raise StageError(f"no published run of {dt} in {config.store}: nothing to compare with")
    report = RunReport.from_json(store.read_bytes(layout.run_report(dt, run.run_id)))
    if report.now_us is None:
        raise StageError(f"the report of run {run.run_id} has no clock (now_us) to run under")
    now = datetime.fromtimestamp(report.now_us / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
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
        DT: dt.isoformat(),
        "published_run_id": run.run_id,
        "whatif_run_id": ctx.run_id,
        "same_exports": staged == published if published else None,
        "tables": {
            t: compare_table(
                table,
                report.tables.get(t, TableSummary()),
                _published_state(spark, store, lake, run, table, runs),
                _whatif_snapshot(spark, ctx.resolved / t / layout.SNAPSHOT, table),
                summary,
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

    return [s.manifests for s in load_inputs(ctx).values()]


def _published_state(
    spark: SparkSession, store: Store, lake: Lake, run: RunRow, table: Table, runs: list[RunRow]
) -> DataFrame:
    """The state ``run`` published for ``table``, checked and read as a run's prior is
    (empty for a table the run did not publish)."""

    if state_path(run, table.name) is None:
        return empty_state(spark, table)
    return read_pinned(spark, pin_state(store, lake, run, table.name, runs))


def _whatif_snapshot(spark: SparkSession, folder: WorkPath, table: Table) -> DataFrame:

    if output_record(folder) is None and not folder.parquet_files():
        return empty_state(spark, table)  # the table's resolve wrote none
    return read_output(spark, folder)


def compare_table(
    table: Table,
    published: TableSummary,
    state: DataFrame,
    mine: DataFrame,
    summary: RunSummary,
) -> dict[str, Any]:
    """The published run's live state rows against the what-if snapshot, joined on the
    key by Spark (``state``, ``mine``: frames of at least the table's columns): one job
    counts both sides and the rows that differ, one more lists the first differing keys
    with both versions (at most :data:`MAX_KEYS` rows reach the driver). ``published``:
    the table in the published run's report (empty if it has none)."""
    key = list(table.key)
    joined = _joined(table, state, mine)
    n = joined.agg(
        F.count(PUB).alias(PUB),
        F.count(MINE).alias(MINE),
        F.sum(F.col(DIFFER).cast("long")).alias(DIFFER),
    ).first()
    count = int(n[DIFFER] or 0) if n else 0
    first = joined.where(F.col(DIFFER)).orderBy(*key).limit(MAX_KEYS).collect()
    s = summary.tables.get(table.name)
    what = {
        "conflicts": s.conflicts if s else {},
        "divergent_keys": s.divergent_keys if s else {},
        "orphans": s.orphans if s else 0,
        "quarantined": s.quarantined if s else {},
    }
    return {
        "rows": {"published": int(n[PUB]) if n else 0, "whatif": int(n[MINE]) if n else 0},
        "differing_rows": {
            "count": count,
            "keys": [{c: r[c] for c in key} for r in first],
            "keys_truncated": count > MAX_KEYS,
            "sample": [
                {
                    KEY: {c: r[c] for c in key},
                    "published": _row(r[PUB]),
                    "whatif": _row(r[MINE]),
                }
                for r in first[:SAMPLE]
            ],
        },
        **{k: {"published": getattr(published, k), "whatif": v} for k, v in what.items()},
    }


def _joined(table: Table, state: DataFrame, mine: DataFrame) -> DataFrame:
    """Per key of either side: its key columns, :data:`PUB` and :data:`MINE` (the row of
    the table's columns, or null) and whether they differ (:data:`DIFFER`)."""
    cols, key = list(table.column_names), list(table.key)
    live = F.coalesce(F.col(STATE_DELETED), F.lit(False))
    theirs = state.where(~live).select(*[_col(c) for c in cols])
    types = {f.name: f.dataType for f in theirs.schema.fields}
    ours = mine.select(*[_col(c).cast(types[c]).alias(c) for c in cols])

    def side(df: DataFrame, name: str) -> DataFrame:
        row = F.struct(*[_col(c) for c in cols])
        return df.select(*[_col(c).alias(f"_k_{c}") for c in key], row.alias(name))

    on = [F.col(f"a._k_{c}").eqNullSafe(F.col(f"b._k_{c}")) for c in key]
    both = side(theirs, PUB).alias("a").join(side(ours, MINE).alias("b"), on, "full_outer")
    keys = [F.coalesce(F.col(f"a._k_{c}"), F.col(f"b._k_{c}")).alias(c) for c in key]
    return both.select(*keys, PUB, MINE).withColumn(DIFFER, ~F.col(PUB).eqNullSafe(F.col(MINE)))


def _col(name: str) -> Column:
    return F.col(f"`{name}`")


def _row(r: Row | None) -> dict[str, Any] | None:
    return None if r is None else r.asDict()


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
