"""The validate stage: Great Expectations suites on what the run is about to publish, and
the gate that decides whether it is published (docs/validation.md).

Two halves. Spark *measures* (:func:`measure_stage`, at the end of the resolve stage's
Spark job): for every table it reads the resolve stage's outputs as Spark DataFrames (the
frames a suite validates: ``snapshot``, ``divergence``, ``fates``, ``cdc_log``,
``cdc_replay``), registers the ones the suites' queries join with as temporary views
(``cdr_state_<t>``, ``cdr_snapshot_<t>``, ``cdr_records_<t>``, ``cdr_conflicts_<t>``,
``cdr_quarantine_<t>``, ``cdr_cdc_streams``) and measures every suite of ``expectations/``
(``pipeline.validate.suites``: the row checks in one query), saved as ``resolved/measures.json``.
GX *judges* (:func:`judge_stage`, no Spark: the DAG's validate task starts no JVM): every
suite in one file-backed GX project in the work folder, its Data Docs, and
``validation/results.json``.

The gate is GX's own severity of each expectation: a failed ``critical`` check fails the
run, a failed ``warning`` one is reported and the run publishes. The ``convergence`` and
``foreign_keys`` checks follow ``on_divergence`` and ``on_fk_violation`` (their templates
say ``"severity": "${on_divergence}"``; ``pipeline.validate.suites.severities``). An
``error`` resolver that stopped a table fails it once: its table is not validated, nor
is any foreign key (docs/rules.md#fine-points: an orphan it leaves is no second failure).
Each failure names the suite, the check, the table and a few offending keys, and what to
do: the setting that decides it and the command that runs the date again
(``pipeline.validate.advice``; docs/validation.md#what-a-failure-names)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.changes.cdc import read_generations
from pipeline.changes.history import as_of_run
from pipeline.changes.replay import entry_micros, replay_differences
from pipeline.core.columns import RUN_ID
from pipeline.core.config import Config, Table
from pipeline.core.errors import StageError
from pipeline.core.summary import RunSummary
from pipeline.ingest import pending
from pipeline.resolve.inplace import touched_prior, untouched_snapshot, whole_snapshot
from pipeline.resolve.state import read_prior
from pipeline.spark.session import local_frame
from pipeline.storage.context import RunContext
from pipeline.storage.lake import Lake
from pipeline.storage.outputs import read_output
from pipeline.storage.store import open_store
from pipeline.storage.targets import final_state
from pipeline.storage.workpath import WorkPath
from pipeline.validate import advice, alerts
from pipeline.validate.datadocs import bundle
from pipeline.validate.shares import shares
from pipeline.validate.suites import (
    SUITES,
    Check,
    Measure,
    Project,
    load_template,
    measure_all,
    render_suite,
)

log = logging.getLogger(__name__)
SAMPLE = 3  # offending rows named in a failure message


@dataclass(frozen=True)
class Verdict:
    """The run's gate: ``failures`` stop the publish; ``warnings`` are reported."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    suites: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures

    def __add__(self, other: Verdict) -> Verdict:
        """Both verdicts' findings, this one's first."""
        return Verdict(
            self.failures + other.failures,
            self.warnings + other.warnings,
            {**self.suites, **other.suites},
        )


def gate_from_summary(summary: RunSummary, config: Config) -> Verdict:
    """What the resolve stage already decided: a table stopped by an ``error`` resolver
    (its failure says what to set: ``advice.stopped``); a topology change the CDC log
    could not apply; late exports an operator accepted."""
    warnings = [summary.cdc.warning] if summary.cdc and summary.cdc.warning else []
    warnings += [
        f"accepted an export that is in no published state: {late}"
        for s in summary.tables.values()
        for late in s.late_exports
    ]
    failures = [
        advice.stopped(config.tables[t], st, summary.dt)
        for t, st in ((t, s.stopped) for t, s in summary.tables.items())
        if st is not None
    ]
    if failures and any(table.foreign_keys for table in config.tables.values()):
        warnings.append(FK_NOT_CHECKED)
    return Verdict(failures, warnings)


#: docs/rules.md#fine-points: after an ``error`` the foreign keys are not checked (an
#: orphan the stopped table leaves is not a second failure)
FK_NOT_CHECKED = "foreign keys not checked: the run stopped on an error resolver"


def message(table: str, c: Check, then: str | None = None) -> str:
    """A failed check: the suite, the check, the table, a few offending rows, and ``then``,
    what to do about it (``advice.for_check``)."""
    rows = "; ".join(json.dumps(r, default=str, separators=(",", ":")) for r in c.sample[:SAMPLE])
    found = f"{c.observed} row(s)" if isinstance(c.observed, int) else f"observed {c.observed}"
    return (
        f"table {table}: expectation {c.suite}/{c.check} failed ({c.description}): {found}"
        + (f", e.g. {rows}" if rows else "")
        + (f". {then}" if then else "")
    )


# ---------------------------------------------------------------------- frames


def _read(spark: SparkSession, path: WorkPath) -> DataFrame:
    return read_output(spark, path)


class Frames:
    """The DataFrames the suites validate, and the views their queries join with."""

    def __init__(self, spark: SparkSession, config: Config, ctx: RunContext, summary: RunSummary):
        self.spark, self.ctx, self.config, self.summary = spark, ctx, config, summary
        self._past: dict[str, list[tuple[str, int, int]]] | None = None
        self.cdc_gens: list[Any] = []
        if config.cdc.enabled:
            self.cdc_gens = read_generations(ctx.resolved / "cdc" / "cdc_generation_descriptions")
            streams = [(g.time, s.to_bytes()) for g in self.cdc_gens for s in g.all_streams()]
            local_frame(spark, streams, "time long, stream_id binary").createOrReplaceTempView(
                "cdr_cdc_streams"
            )
        parents = {fk.references for table in config.tables.values() for fk in table.foreign_keys}
        for t in config.tables:
            out = ctx.resolved / t
            _read(spark, final_state(out)).createOrReplaceTempView(f"cdr_state_{t}")
            _read(spark, out / "snapshot").createOrReplaceTempView(f"cdr_snapshot_{t}")
            if t in parents:  # the foreign_keys suite's (the Delta table read only then)
                whole = self.whole_snapshot(config.tables[t])
                whole.createOrReplaceTempView(f"cdr_whole_snapshot_{t}")
            if config.tables[t].unique:  # the snapshot suite's unique_in_table
                kept = self.untouched_snapshot(config.tables[t])
                kept.createOrReplaceTempView(f"cdr_untouched_snapshot_{t}")
            _read(spark, out / "conflicts").createOrReplaceTempView(f"cdr_conflicts_{t}")
            quarantine = _read(spark, out / "quarantine")
            quarantine.createOrReplaceTempView(f"cdr_quarantine_{t}")
            shares(spark, ctx, t, quarantine).createOrReplaceTempView(f"cdr_quarantine_shares_{t}")
            replicas = summary.tables[t].replicas.items()
            records = [(r, pending.to_account(v)) for r, v in replicas]
            local_frame(spark, records, "replica string, records long").createOrReplaceTempView(
                f"cdr_records_{t}"
            )

    def whole_snapshot(self, table: Table) -> DataFrame:
        """The table's snapshot as the publish will leave it: the run's, or, merged in
        place, the run's rows over the published snapshot's others (``inplace``)."""

        out = self.ctx.resolved / table.name
        whole = whole_snapshot(self.spark, self.ctx.staged / table.name, out, table)
        return _read(self.spark, out / "snapshot") if whole is None else whole

    def untouched_snapshot(self, table: Table) -> DataFrame:
        """The published snapshot rows the publish keeps as they are: merged in place,
        those of the keys the run did not touch (``inplace``); else none (the run's
        snapshot replaces the table)."""

        out = self.ctx.resolved / table.name
        kept = untouched_snapshot(self.spark, self.ctx.staged / table.name, out, table)
        if kept is None:
            snapshot = _read(self.spark, out / "snapshot")
            return self.spark.createDataFrame([], snapshot.schema)
        return kept

    def batch(self, kind: str, table: Table) -> DataFrame:
        out = self.ctx.resolved / table.name
        if kind in ("snapshot", "divergence", "fates"):
            return _read(self.spark, out / kind)
        if kind == "whole_snapshot":
            return self.whole_snapshot(table)
        if kind == "history":
            return as_of_run(_read(self.spark, out / kind), table, self.ctx)
        if kind == "cdc_log":
            return self._cdc_log(table)
        if kind == "conflict_rates":
            return self._conflict_rates(table)
        if kind == "cdc_replay":
            # the run's resolve read (and checked) the same staged state; merged in
            # place, the rows its fold read: the snapshot holds theirs only
            prior = read_prior(self.spark, self.ctx.staged / table.name, table, check=False)
            prior = touched_prior(prior, out, table)
            return replay_differences(
                prior, self._log(table), self.batch("snapshot", table), table, self.ctx.now_us
            )
        raise ValueError(f"no frame {kind!r} (expectations/*.json meta.batch)")

    def _conflict_rates(self, table: Table) -> DataFrame:
        """The ``alerts`` suite's batch (``pipeline.validate.alerts``): the table's past
        published runs of the alert's window, read once for every table, and tonight."""
        alert = self.config.conflict_rate_alert
        assert alert is not None and self.config.store
        if self._past is None:
            lake = Lake(open_store(self.config.store))
            self._past = alerts.past_counts(lake, self.ctx.dt, alert.window)
        tonight = self.summary.tables[table.name]
        rows = alerts.rates_batch(self._past.get(table.name, []), self.ctx.dt, tonight)
        return local_frame(self.spark, rows, alerts.SCHEMA)

    def _log(self, table: Table) -> DataFrame:
        return _read(self.spark, self.ctx.resolved / "cdc" / table.name / "log")

    def _cdc_log(self, table: Table) -> DataFrame:
        """The log with the time of each entry and the generation operating then."""

        t = entry_micros(F.col("`cdc$time`"))
        generation = F.lit(None).cast("long")
        for g in sorted(self.cdc_gens, key=lambda g: g.time):  # the latest one not after t
            generation = F.when(t >= g.time, F.lit(g.time)).otherwise(generation)
        first = min(g.time for g in self.cdc_gens)  # it also covers everything before it
        return self._log(table).select(
            "*", F.coalesce(generation, F.lit(first)).alias("generation")
        )


# ---------------------------------------------------------------------- the stage

#: what Spark measured for the suites of a resolved run (``measure_stage``), in its
#: ``resolved`` folder
MEASURES = "measures.json"


def _suite_runs(config: Config, summary: RunSummary) -> list[tuple[str, str, dict[str, Any]]]:
    """Every suite of every table the run did not stop on: (table, batch, suite)."""
    runs = []
    for name in SUITES:
        template = load_template(name)
        if template["meta"].get("needs") == "cdc" and not config.cdc.enabled:
            continue
        if template["meta"].get("needs") == "alerts" and config.conflict_rate_alert is None:
            continue
        if name == "foreign_keys" and any(s.stopped for s in summary.tables.values()):
            continue  # docs/rules.md#fine-points: not checked after an error (FK_NOT_CHECKED)
        for t, table in config.tables.items():
            if summary.stopped(t):
                # docs/rules.md#fine-points: the run stopped on this table; nothing to publish
                continue
            if template["meta"].get("needs") == "history" and table.history is None:
                continue
            suite = render_suite(template, table, config)
            if suite["expectations"]:
                runs.append((t, template["meta"]["batch"], suite))
    return runs


def measure_stage(
    spark: SparkSession,
    config: Config,
    ctx: RunContext,
    summary: RunSummary,
    one_task: bool = False,
) -> None:
    """Spark's half of validation, at the end of the resolve stage's Spark job: what every
    suite's batch holds for GX to judge (``suites.measure_all``: the row checks in one
    query; ``one_task`` for a small run), saved for :func:`judge_stage`."""
    runs = _suite_runs(config, summary)
    frames = Frames(spark, config, ctx, summary)
    try:
        batches = [(frames.batch(batch, config.tables[t]), suite) for t, batch, suite in runs]
        measures = measure_all(batches, one_task)
    finally:
        spark.catalog.clearCache()
    body = {
        RUN_ID: ctx.run_id,
        "resolve_id": summary.resolve_id,
        "suites": [
            {"table": t, "suite": suite, "measure": m.to_dict()}
            for (t, _, suite), m in zip(runs, measures, strict=True)
        ],
    }
    (ctx.resolved / MEASURES).write_text(json.dumps(body, default=str))


def measured(ctx: RunContext, summary: RunSummary) -> bool:
    """Whether this very resolve of the run was measured (a resolve measures)."""
    p = ctx.resolved / MEASURES
    if not p.exists():
        return False
    d = json.loads(p.read_text())
    return d.get(RUN_ID) == ctx.run_id and d.get("resolve_id") == summary.resolve_id


def judge_stage(config: Config, ctx: RunContext, summary: RunSummary) -> Verdict:
    """GX's half of validation, without Spark: every suite judged on what the resolve
    measured, the Data Docs, and the verdict in ``validation/results.json``."""
    if not measured(ctx, summary):
        raise StageError(
            f"the resolved run of {ctx.dt} has no measures of its own in {ctx.resolved}: "
            "run `cdr resolve` again"
        )
    measures = json.loads((ctx.resolved / MEASURES).read_text())["suites"]
    verdict = gate_from_summary(summary, config)
    ctx.validation.rmtree()
    (ctx.work / "gx").rmtree()  # a rerun of this stage starts a new project
    with ctx.work.writing() as root:  # GX's project on a local disk (uploaded, on S3)
        docs = root / ctx.validation.name / "data_docs"
        project = Project(root, docs, ctx.run_id)
        verdict += _judge(project, measures, ctx.data_docs, config, ctx.dt.isoformat())
        if ctx.data_docs:
            bundle(docs)  # pages that open without internet
    ctx.results.write_text(
        json.dumps(
            {
                RUN_ID: ctx.run_id,
                "resolve_id": summary.resolve_id,
                "passed": verdict.passed,
                "failures": verdict.failures,
                "warnings": verdict.warnings,
                "suites": verdict.suites,
                "data_docs": "data_docs/index.html" if ctx.data_docs else None,
            },
            indent=2,
            default=str,
        )
    )
    return verdict


def validate_stage(
    spark: SparkSession, config: Config, ctx: RunContext, summary: RunSummary
) -> Verdict:
    """Measure (Spark) then judge (GX): ``cdr validate`` of a run resolved before measures
    were part of the resolve, or measured again."""
    measure_stage(spark, config, ctx, summary)
    return judge_stage(config, ctx, summary)


def _judge(
    project: Project,
    measures: list[dict[str, Any]],
    docs: bool,
    config: Config | None = None,
    dt: str = "D",
) -> Verdict:
    """Every suite judged by GX in one checkpoint (its action builds the Data Docs), and
    their verdict: a failed critical check fails the run, saying what to set
    (``advice.for_check`` of ``config``), any other is a warning."""
    started = time.monotonic()
    verdict = Verdict()
    judged = project.judge_all(
        [(m["suite"], Measure.from_dict(m["measure"])) for m in measures], docs=docs
    )
    for m, checks in zip(measures, judged, strict=True):
        t, suite = m["table"], m["suite"]
        ok = all(c.success for c in checks)
        verdict.suites[suite["name"]] = {"success": ok, "checks": [asdict(c) for c in checks]}
        for c in checks:
            if c.success:
                continue
            if c.severity != "critical":
                verdict.warnings.append(message(t, c))
                continue
            then = advice.for_check(config, c.suite, c.check, dt) if config else None
            verdict.failures.append(message(t, c, then))
        log.info("validate %s: %s", suite["name"], "passed" if ok else "FAILED")
    log.info(
        "validate: %d suites, %d failed (%.1fs)",
        len(measures),
        sum(not s["success"] for s in verdict.suites.values()),
        time.monotonic() - started,
    )
    return verdict


def load_verdict(ctx: RunContext, summary: RunSummary | None = None) -> Verdict:
    """The run's verdict; with ``summary`` (what publish is about to publish), refused
    unless it was reached on that very resolve of this run: never a stale verdict."""
    if not ctx.results.exists():
        raise StageError(f"the run of {ctx.dt} has not been validated: run `cdr validate` first")
    d = json.loads(ctx.results.read_text())
    if summary is not None and (
        d.get(RUN_ID) != ctx.run_id or d.get("resolve_id") != summary.resolve_id
    ):
        raise StageError(
            f"the validation results of {ctx.dt} ({ctx.results}) are for another resolve "
            f"(run {d.get('run_id')}, resolve {d.get('resolve_id')}) than the one to publish "
            f"(run {ctx.run_id}, resolve {summary.resolve_id}): run `cdr validate` again"
        )
    return Verdict(d["failures"], d["warnings"], d["suites"])
