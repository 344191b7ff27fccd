"""The run report (docs/outputs.md#the-run-report): what a run says of itself. Built by
``pipeline.stages.run_report``, completed by publish (the Data Docs files, the versions it
committed), saved as JSON in the run's report folder; read by the text report, the CLI,
the Conflicts page, the DAG's asset events, the ``runs`` row and ``cdr whatif``. Frozen.
:meth:`RunReport.from_dict` reads the reports of earlier releases too: a store keeps them
for years."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pipeline.core.columns import DT, RUN_ID
from pipeline.core.summary import CdcSection, MalformedReport, TableSummary


class Status(StrEnum):
    """What became of a run: its report's and its ``runs`` row's ``status``."""

    PUBLISHED = "published"
    FAILED = "failed"  # its gate failed, or it stopped before publish
    DRY_RUN = "dry_run"  # ingest, resolve and validate; nothing published


@dataclass(frozen=True)
class ReportValidation:
    """Where the run's validation results are in the store, and each suite's verdict."""

    results: str = ""  # the key of results.json
    data_docs: str | None = None  # the key of the Data Docs' index page; None: none built
    suites: Mapping[str, bool] = field(default_factory=dict)  # suite -> passed
    #: publish: the Data Docs files it wrote, path -> sha256 (the plugin serves these only)
    data_docs_files: Mapping[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "results": self.results,
            "data_docs": self.data_docs,
            "suites": dict(self.suites),
        }
        if self.data_docs_files is not None:
            d["data_docs_files"] = dict(self.data_docs_files)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> ReportValidation:
        if not isinstance(d, Mapping):
            raise MalformedReport("its validation is not a mapping")
        suites = d.get("suites") or {}
        files = d.get("data_docs_files")
        if not isinstance(suites, Mapping) or not isinstance(files, Mapping | None):
            raise MalformedReport("its suites or Data Docs files are not a mapping")
        return cls(
            results=d.get("results", ""),
            data_docs=d.get("data_docs"),
            suites=dict(suites),
            data_docs_files=dict(files) if files is not None else None,
        )


@dataclass(frozen=True)
class RunReport:
    """One run's report. ``to_dict`` gives the JSON publish writes (its keys in this
    order; ``now_us``, ``cdc``, ``versions`` and ``validation.data_docs_files`` only when
    set, ``alerts`` and ``seconds`` only when not empty); ``from_dict`` takes what a
    missing key leaves out from its default and ignores a key it does not know."""

    run_id: str
    dt: str  # the run's date (ISO)
    #: a :class:`Status`; in a report file not written by a run, whatever text it holds
    status: Status | str
    started: str = ""  # when the run's ingest started (ISO)
    now_us: int | None = None  # the run's clock (µs)
    store: str | None = None
    failures: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    tables: Mapping[str, TableSummary] = field(default_factory=dict)
    validation: ReportValidation = field(default_factory=ReportValidation)
    cdc: CdcSection | None = None  # with ``cdc.enabled``
    versions: Mapping[str, int] | None = None  # publish: table path -> version it committed
    #: docs/operations.md#alerts: table -> the alert it fired (``pipeline.validate.alerts.fired``)
    alerts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: docs/operations.md#metrics: stage -> its seconds (ingest, resolve, validate, publish)
    seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def published(self) -> bool:
        return self.status == Status.PUBLISHED

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {RUN_ID: self.run_id, DT: self.dt, "started": self.started}
        if self.now_us is not None:
            d["now_us"] = self.now_us
        d |= {
            "store": self.store,
            "status": str(self.status),
            "failures": list(self.failures),
            "warnings": list(self.warnings),
            "tables": {t: s.to_dict() for t, s in self.tables.items()},
            "validation": self.validation.to_dict(),
        }
        if self.cdc is not None:
            d["cdc"] = self.cdc.to_dict()
        if self.versions is not None:
            d["versions"] = dict(self.versions)
        if self.alerts:
            d["alerts"] = {t: dict(a) for t, a in self.alerts.items()}
        if self.seconds:
            d["seconds"] = dict(self.seconds)
        return d

    def to_json(self) -> str:
        """The report file, as publish writes it."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: Any) -> RunReport:
        """A report as saved. :class:`MalformedReport` if it is not one: not a mapping,
        no run id, date or status, a section that is not a mapping. The counts are taken
        as they are (``TableSummary.from_dict``)."""
        if not isinstance(d, Mapping):
            raise MalformedReport("it is not a JSON object")
        missing = [k for k in (RUN_ID, DT, "status") if k not in d]
        if missing:
            raise MalformedReport(f"it has no {', '.join(missing)}")
        cdc, versions = d.get("cdc"), d.get("versions")
        alerts, seconds = d.get("alerts") or {}, d.get("seconds") or {}
        if not isinstance(versions, Mapping | None):
            raise MalformedReport("its versions are not a mapping")
        if not isinstance(alerts, Mapping) or not all(
            isinstance(a, Mapping) for a in alerts.values()
        ):
            raise MalformedReport("its alerts are not a mapping of tables")
        if not isinstance(seconds, Mapping):
            raise MalformedReport("its seconds are not a mapping of stages")
        return cls(
            run_id=str(d[RUN_ID]),
            dt=str(d[DT]),
            status=status_of(d["status"]),
            started=d.get("started", ""),
            now_us=d.get("now_us"),
            store=d.get("store"),
            failures=_texts(d.get("failures")),
            warnings=_texts(d.get("warnings")),
            tables=tables_of(d.get("tables") or {}),
            validation=ReportValidation.from_dict(d.get("validation") or {}),
            cdc=CdcSection.from_dict(cdc) if cdc is not None else None,
            versions=dict(versions) if versions is not None else None,
            alerts={str(t): dict(a) for t, a in alerts.items()},
            seconds={str(k): float(v) for k, v in seconds.items()},
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> RunReport:
        """A report file: ``ValueError`` if it is not JSON, :class:`MalformedReport` (a
        ``ValueError``) if it is not a report."""
        return cls.from_dict(json.loads(text))


def status_of(text: Any) -> Status | str:
    """The :class:`Status` named ``text``, or the text itself."""
    text = str(text)
    return Status(text) if text in _STATUSES else text


_STATUSES = frozenset(s.value for s in Status)


def tables_of(d: Any) -> dict[str, TableSummary]:
    """A report's ``tables`` (or a ``runs`` row's), each as ``TableSummary.from_dict``."""
    if not isinstance(d, Mapping):
        raise MalformedReport("its tables are not a mapping of tables")
    return {str(t): TableSummary.from_dict(s) for t, s in d.items()}


def _texts(v: Any) -> tuple[str, ...]:
    """A list of failures or warnings; one text alone is a list of one."""
    if not v:
        return ()
    return tuple(str(x) for x in v) if isinstance(v, list | tuple) else (str(v),)
