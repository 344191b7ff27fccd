"""Ingest: find each configured replica's export for the date through its manifest
(``pipeline.ingest.manifests``), check it, and plan its files, which ``fetch`` (the
resolve stage's first Spark job) fetches, verifies and stages in Spark tasks
(``pipeline.ingest.fetch``, docs/adapters.md); pin the state each table starts from and
the published tables the run reads.

Guarantees:
- every file is checked against the manifest's ``rows`` and ``sha256`` before anything is
  read, and a mismatch names the file;
- a missing export of a configured replica fails the ingest, naming it, unless
  ``allow_missing_exports`` is set (then the replica counts as having exported nothing);
- a date skipped since a table's state, an earlier date's export that arrived or changed
  after its run, and a run that would break the chain of published dates stop the run.

Ingest reads manifests only; the bytes go where ``pipeline.ingest.fetch`` says."""

from __future__ import annotations

import json
import logging
from datetime import date
from typing import Any

from pipeline.core import layout
from pipeline.core.columns import DT, REPLICA, RUN_ID
from pipeline.core.config import Config, UnknownExportPolicy
from pipeline.core.errors import ExportError
from pipeline.core.progress import current as progress
from pipeline.ingest import decisions, inplace, missing_events, pending, prior, retry
from pipeline.ingest.adapters import check_requirements
from pipeline.ingest.fetch import FileTask, plan_export, save_plan
from pipeline.ingest.inputs import StagedTable, save_inputs
from pipeline.ingest.late import find_late, late_error
from pipeline.ingest.manifests import (
    ROW_FORMATS,
    find_export,
    manifest_digest,
    read_manifest,
    unpublished_dates,
)
from pipeline.ingest.staging import Limits
from pipeline.storage.context import RunContext
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import (
    RunRow,
    later_dates,
    latest_published,
    now,
    read_runs,
    replaced_under,
)
from pipeline.storage.store import Store

log = logging.getLogger(__name__)


def ingest(
    config: Config,
    store: Store,
    ctx: RunContext,
    allow_missing: bool,
    accept_late: bool = False,
    backfill: bool = False,
) -> dict[str, StagedTable]:
    """Stage every export of ``ctx.dt``, the state the run starts from (or the base
    snapshot), the ledger window and the CDC generations. An earlier date's export that
    arrived or changed after its run stops the run, unless ``accept_late``; so does a
    state to start from that was built on a run since replaced, and a run of a date with
    later published dates unless ``backfill`` (they run after it, in order)."""
    lake = Lake(store)
    runs = read_runs(lake)
    late = find_late(config, store, runs, ctx.dt)
    if late and not accept_late:
        raise ExportError(late_error(late))
    refuse_a_broken_chain(config, runs, ctx, backfill)
    save_notices(ctx, unknown_exports(config, store))
    out: dict[str, StagedTable] = {}
    gaps: list[str] = []
    tasks: list[FileTask] = []
    for i, tname in enumerate(config.tables, 1):
        progress().step(tname, i, len(config.tables), "tables")
        st = out[tname] = _stage_exports(config, store, ctx, tname, tasks)
        _stage_snapshots(config, store, ctx, tname, st, tasks)
        _stage_start(config, store, lake, runs, ctx, tname, st, gaps, tasks)
        _pin_read_tables(config, store, lake, runs, ctx, tname, st)
        retry.stage(
            config,
            lake,
            runs,
            config.tables[tname],
            ctx.dt,
            ctx.now_us,
            ctx.staged / tname / "retry",
        )
    decisions.stage(lake, ctx.dt, config.tables, ctx.staged)
    missing_events.stage(lake, ctx.dt, config.gc_grace_seconds, config.tables, ctx.staged)
    _refuse_gaps_and_missing(config, store, ctx, out, gaps, allow_missing)
    for x in late:
        log.warning("ingest: accepted: %s", x)
        out[x.table].manifests.append(x.record())
        out[x.table].late_exports.append(str(x))
    if config.cdc.enabled:
        name = "cdc_generation_descriptions"
        prior.stage_small(lake, layout.cdc_table_dir(name), ctx.staged / "cdc" / name)
    save_inputs(ctx, out)
    save_plan(ctx, tasks)
    return out


def _refuse_gaps_and_missing(
    config: Config,
    store: Store,
    ctx: RunContext,
    out: dict[str, StagedTable],
    gaps: list[str],
    allow_missing: bool,
) -> None:
    """Stop on a date skipped since a table's state (``gaps``), and on a missing export
    unless allowed."""
    if gaps:
        raise ExportError(
            f"cannot run {ctx.dt}: {'; '.join(gaps)}. Each date starts from the state of the "
            "date before it: run (or rerun) those dates first, in order"
        )
    missing_all = [f"replica {r!r} table {t!r}" for t, st in out.items() for r in st.missing]
    if missing_all and not (allow_missing or config.allow_missing_exports):
        raise ExportError(
            f"no export for {ctx.dt}: {', '.join(missing_all)} (looked for "
            f"exports/replica=<id>/table=<table>/dt={ctx.dt}/{layout.MANIFEST} in {store.uri}); "
            "pass --allow-missing-exports to run without them"
        )


#: what ingest tells the run's report beside the tables (in ``staged``)
NOTICES = "notices.json"


def unknown_exports(config: Config, store: Store) -> list[str]:
    """docs/operations.md#a-loud-quarantine: a warning per folder of ``exports/`` that no
    configured replica's exports are in (they are not read); with ``on_unknown_export:
    fail`` the run stops (:class:`ExportError`), naming them. One listing of the level."""
    known = {f"replica={r}" for r in config.replica_ids}
    unknown = [f for f in store.folders("exports") if f not in known]
    if not unknown:
        return []
    said = [
        f"{store.uri}/exports/{f}/ holds exports of a replica the config does not name "
        f"(replicas: {', '.join(config.replica_ids)}): they are not read; add it to "
        "`replicas`, or move the folder away"
        for f in unknown
    ]
    if config.on_unknown_export is UnknownExportPolicy.FAIL:
        raise ExportError("; ".join(said) + " (on_unknown_export: fail)")
    for w in said:
        log.warning("ingest: %s", w)
    return said


def save_notices(ctx: RunContext, notices: list[str]) -> None:
    (ctx.staged / NOTICES).write_text(json.dumps(notices))


def load_notices(ctx: RunContext) -> list[str]:
    """What ingest told the run's report (none from a run staged before notices)."""
    p = ctx.staged / NOTICES
    return list(json.loads(p.read_text())) if p.is_file() else []


def refuse_a_broken_chain(
    config: Config, runs: list[RunRow], ctx: RunContext, backfill: bool
) -> None:
    """docs/operations.md#reruns-and-backfills: every date starts from the state of the
    one before, so a run of ``ctx.dt`` is refused (:class:`ExportError`, naming the dates
    and the command) when a table's state to start from was built on a run since replaced
    (``runs_table.replaced_under``), and, unless it is a ``backfill`` (the later dates run
    after it, in order) or a dry run, when dates after it are published: running it alone
    would leave them built on the run it replaces."""
    for t in config.tables:
        replaced = replaced_under(runs, t, ctx.dt)
        if replaced is not None:
            raise ExportError(f"cannot run {ctx.dt}: {replaced}, then {ctx.dt}")
    later = later_dates(runs, config.tables, ctx.dt)
    if later and not backfill and not ctx.dry_run:
        dates = ", ".join(map(str, later))
        raise ExportError(
            f"cannot run {ctx.dt} alone: {dates} {'was' if len(later) == 1 else 'were'} "
            f"published after it, each built on the state of the date before. Run it with "
            f"them, in order: `cdr run --date {ctx.dt} --then-later` (under Airflow: a "
            f"backfill from {ctx.dt} to {later[-1]})"
        )


def _pin_read_tables(
    config: Config,
    store: Store,
    lake: Lake,
    runs: list[RunRow],
    ctx: RunContext,
    tname: str,
    st: StagedTable,
) -> None:
    """The published tables the run reads besides its prior state, pinned: the ledger's
    window, the lines the run it starts from left waiting (``pipeline.ingest.pending``) and
    (history) the history the run rewrites whole."""
    ledger = prior.pin_ledger(store, lake, tname, ctx.dt, config.gc_grace_seconds)
    if ledger is not None:
        ledger.save(ctx.staged / tname / prior.LEDGER_PIN)
        st.ledger = list(ledger.dates or ())
        st.legacy_ids = prior.window_has_legacy_ids(runs, tname, st.ledger)
    if st.prior is not None and DT in st.prior:
        pending.pin(store, lake, tname, dt_of(st.prior), ctx.staged / tname)
    if config.tables[tname].history is not None:
        history = prior.pin_table(store, lake, layout.table_path(tname, layout.HISTORY))
        if history is not None:
            history.save(ctx.staged / tname / prior.HISTORY_PIN)


def _stage_exports(
    config: Config, store: Store, ctx: RunContext, tname: str, tasks: list[FileTask]
) -> StagedTable:
    """Each replica's export of the table for the run's date (a missing one is noted)."""
    st = StagedTable()
    for rep in config.replica_ids:
        folder = layout.export_dir(rep, tname, ctx.dt)
        if not find_export(store, folder, f"replica {rep!r}, table {tname!r}"):
            st.missing.append(rep)
            continue
        manifest = read_manifest(
            store, folder, {REPLICA: rep, "table": tname, DT: ctx.dt.isoformat()}
        )
        where = f"{store.uri}/{folder}/{layout.MANIFEST}"
        check_requirements(manifest["format"], manifest["options"], config.tables[tname], where)
        st.manifests.append(manifest_digest(store, folder))
        dest = ctx.staged / tname / f"replica={rep}"
        staged, files = plan_export(
            store, folder, manifest, dest, rep, tname, "export", Limits.of(config)
        )
        st.exports[rep] = staged
        tasks += files
        log.info(
            "ingest %s/%s: %d %s line(s) in %d file(s)",
            rep,
            tname,
            staged.rows,
            staged.format,
            len(files),
        )
    return st


def _stage_snapshots(
    config: Config,
    store: Store,
    ctx: RunContext,
    tname: str,
    st: StagedTable,
    tasks: list[FileTask],
) -> None:
    """The replicas' optional full copies of the table, compared after the resolve."""
    for rep in config.replica_ids:
        folder = layout.replica_snapshot_dir(rep, tname, ctx.dt)
        if find_export(store, folder, f"snapshot of replica {rep!r}, table {tname!r}"):
            manifest = read_manifest(
                store,
                folder,
                {REPLICA: rep, "table": tname, DT: ctx.dt.isoformat()},
                ROW_FORMATS,
            )
            st.manifests.append(manifest_digest(store, folder))
            dest = ctx.staged / tname / f"snapshot={rep}"
            snapshot, files = plan_export(
                store, folder, manifest, dest, rep, tname, "snapshot", Limits.of(config)
            )
            st.snapshots[rep] = snapshot.rows
            tasks += files
            log.info("ingest %s/%s: snapshot of %d rows", rep, tname, st.snapshots[rep])


def _pin_prior(
    config: Config,
    store: Store,
    lake: Lake,
    runs: list[RunRow],
    run: RunRow,
    ctx: RunContext,
    tname: str,
    st: StagedTable,
) -> None:
    """The published state ``run`` names, pinned; and whether the run merges the table
    in place (``pipeline.ingest.inplace``)."""
    pin = prior.pin_state(store, lake, run, tname, runs)
    pin.save(ctx.staged / tname / prior.PRIOR_PIN)
    st.prior = {DT: run.dt.isoformat(), RUN_ID: run.run_id, "state_rows": pin.rows}
    st.start = f"the state of {run.dt} (run {run.run_id}, {pin.rows} rows)"
    plan = inplace.plan(config, lake, runs, run, pin, tname, ctx.dt, ctx.now_us)
    if plan.record is not None:
        st.prior[inplace.STAGED_KEY] = plan.record.to_json()
        st.start += ", merged in place"
    else:
        log.info("ingest %s: the whole table is replaced (%s)", tname, plan.why_not)


def _stage_start(
    config: Config,
    store: Store,
    lake: Lake,
    runs: list[RunRow],
    ctx: RunContext,
    tname: str,
    st: StagedTable,
    gaps: list[str],
    tasks: list[FileTask],
) -> None:
    """What the table starts from (docs/outputs.md#backfills): the state published for the
    latest date before the run's, within the retention and checked against that run's
    ``runs`` row; on a store of the earlier layout, its pointer (once); else ``base/`` (a
    table new to the config, or the first run); else nothing."""
    dest = ctx.staged / tname / "prior"
    run = latest_published(runs, tname, ctx.dt)
    if run is not None:
        prior.refuse_outside_retention(runs, run, tname, ctx.dt, config.retention_days, now())
        _pin_prior(config, store, lake, runs, run, ctx, tname, st)
    elif not runs and (pointer := prior.legacy_prior(store, tname, ctx.dt)) is not None:
        staged = prior.stage_legacy_state(store, tname, pointer, dest)
        log.warning(
            "ingest %s: %s has no runs table; starting from the earlier layout's state of %s "
            "(run %s, %d rows), once: this run publishes in the Delta layout",
            tname,
            store.uri,
            pointer[DT],
            pointer[RUN_ID],
            staged.rows,
        )
        st.prior = {DT: pointer[DT], RUN_ID: pointer[RUN_ID], "state_rows": staged.rows}
        st.start = f"the state of {pointer['dt']} in the earlier layout (run {pointer['run_id']})"
    elif find_export(store, base := layout.base_dir(tname), "base snapshot"):
        manifest = read_manifest(store, base, {"table": tname}, ROW_FORMATS)
        st.manifests.append(manifest_digest(store, base))
        dest = ctx.staged / tname / "base"
        staged_base, files = plan_export(
            store, base, manifest, dest, "base", tname, "base", Limits.of(config)
        )
        tasks += files
        st.base_rows = staged_base.rows
        st.start = f"base/ ({staged_base.rows} rows): no published run had this table"
        log.info("ingest base/%s: %d rows", tname, staged_base.rows)
    else:
        st.start = "empty: no published run had this table, and there is no base/"
    if st.prior is not None:
        skipped = unpublished_dates(config, store, tname, dt_of(st.prior), ctx.dt)
        if skipped:
            gaps.append(
                f"table {tname!r} was last published for {st.prior['dt']}, but "
                f"{', '.join(map(str, skipped))} has exports that no published run applied"
            )
        log.info("ingest %s: starts from %s", tname, st.start)


def dt_of(pointer: dict[str, Any]) -> date:
    return date.fromisoformat(pointer[DT])
