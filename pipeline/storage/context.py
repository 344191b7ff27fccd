"""One run: its logical date, its clock, its id and its work folder.

The clock ``now`` is the end of the data interval (``D+1T00:00:00Z``), never the wall clock,
so that a rerun of D gives the same rows (docs/rules.md#terms, docs/rules.md#fine-points).
``--now`` or ``CDR_NOW`` pins it. The stages of one run (``cdr ingest``, ``resolve``,
``validate``, ``publish``) hand data to each other through the run's own work folder
``<work_dir>/run=<run_id>/`` (a local folder or an S3 prefix:
``pipeline.storage.workpath``): two runs never touch each other's files."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.columns import DT, RUN_ID
from pipeline.core.errors import CdrError, StageError, StoreError
from pipeline.core.instants import micros_to_iso as micros_to_iso  # its home is core: re-exported
from pipeline.storage.workpath import WorkPath

if TYPE_CHECKING:
    from pipeline.core.config import Config

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$", re.IGNORECASE
)


def parse_rfc3339(text: str) -> datetime:
    """An RFC 3339 timestamp with its UTC offset (a timestamp without one is refused)."""
    t = text.strip()
    if not _RFC3339.match(t):
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp with a UTC offset")
    t = t.replace("z", "Z").replace("Z", "+00:00")
    frac = re.search(r"\.(\d+)", t)
    if frac and len(frac.group(1)) > 6:  # datetime takes microseconds at most
        t = t.replace(frac.group(0), "." + frac.group(1)[:6])
    return datetime.fromisoformat(t).astimezone(UTC)


def to_micros(dt: datetime) -> int:
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def default_now(dt: date) -> datetime:
    return datetime(dt.year, dt.month, dt.day, tzinfo=UTC) + timedelta(days=1)


def resolve_now(dt: date, flag: str | None) -> int:
    """The run's clock in µs: the flag, else ``CDR_NOW``, else the end of the interval."""
    text = flag or os.environ.get("CDR_NOW")
    if not text:
        return to_micros(default_now(dt))
    try:
        return to_micros(parse_rfc3339(text))
    except ValueError as e:
        raise CdrError(f"--now/CDR_NOW: {e}") from None


def new_run_id(dt: date) -> str:
    """A fresh run id: the date, then the wall clock (identity only; no logic reads it)."""
    return f"{dt.isoformat()}_{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}"


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def check_run_id(run_id: str) -> str:
    """A run id names folders and files: letters, digits, ``.``, ``_`` and ``-``."""
    if not _RUN_ID.match(run_id):
        raise CdrError(
            f"run id {run_id!r}: use 1-200 letters, digits, '.', '_' or '-' "
            "(it names the run's folders)"
        )
    return run_id


def safe_run_id(text: str) -> str:
    """Any text (an Airflow run id) made into a run id."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:200] or "run"


@dataclass(frozen=True)
class RunContext:
    """One run. ``tables`` (a subset, or None for all), ``on_divergence`` (an override)
    ``dry_run`` and ``data_docs`` are the run's options, fixed at ingest so that every later
    stage, in whatever process, sees the same ones."""

    dt: date
    now_us: int
    run_id: str
    work: WorkPath
    tables: tuple[str, ...] | None = None
    on_divergence: str | None = None
    dry_run: bool = False
    data_docs: bool = True  # build the Great Expectations Data Docs pages
    config_digest: str | None = None  # Config.digest() at ingest
    started: str = ""  # when ingest began (RFC 3339)
    epoch: str = (
        ""  # the store's lease as ingest took it (storage.lease): later stages re-enter with it
    )
    accept_alert: bool = False  # ``--accept-alert``: a fired alert only warns

    def config(self, config: Config) -> Config:
        """The config as this run uses it (its tables and overrides); one edited since the
        run's ingest is refused: the stages of one run must agree on it."""
        if self.config_digest is not None and config.digest() != self.config_digest:
            raise StageError(
                f"the config changed since the run of {self.dt} ({self.run_id}) was ingested: "
                "its stages would not agree. Run the date again from `cdr ingest` (or `cdr run`)"
            )
        return config.select(self.tables, self.on_divergence, self.accept_alert)

    @property
    def staged(self) -> WorkPath:
        return self.work / "staged"

    @property
    def resolved(self) -> WorkPath:
        return self.work / "resolved"

    @property
    def validation(self) -> WorkPath:
        return self.work / "validation"

    @property
    def results(self) -> WorkPath:
        """The validate stage's verdict; its presence means the run was validated."""
        return self.validation / "results.json"

    @property
    def interval_start_us(self) -> int:
        return to_micros(datetime(self.dt.year, self.dt.month, self.dt.day, tzinfo=UTC))

    def save(self) -> None:
        data = asdict(self) | {DT: self.dt.isoformat(), "work": self.work.as_uri()}
        (self.work / "run.json").write_text(json.dumps(data, indent=2))

    @staticmethod
    def load(work_dir: WorkPath | Path | str, dt: date, run_id: str | None = None) -> RunContext:
        """The run ``run_id`` of ``dt`` in ``work_dir``; without an id, the date's latest."""
        work_dir = WorkPath.of(work_dir)
        if run_id is not None:
            run = _read(work_dir / f"run={check_run_id(run_id)}" / "run.json")
            found = [run] if run is not None else []
        else:
            found = runs_of(work_dir, dt)
        if not found:
            which = f"run {run_id}" if run_id else "no ingested run"
            raise StageError(
                f"{which} for {dt} under {work_dir.as_uri()}: run `cdr ingest` for that date first"
            )
        if found[-1].dt != dt:
            raise StageError(f"run {found[-1].run_id} is a run of {found[-1].dt}, not of {dt}")
        return found[-1]

    @staticmethod
    def create(
        work_dir: WorkPath | Path | str,
        dt: date,
        now_us: int,
        run_id: str | None,
        tables: tuple[str, ...] | None = None,
        on_divergence: str | None = None,
        dry_run: bool = False,
        data_docs: bool = True,
        config_digest: str | None = None,
        accept_alert: bool = False,
    ) -> RunContext:
        rid = check_run_id(run_id) if run_id else new_run_id(dt)
        return RunContext(
            dt,
            now_us,
            rid,
            WorkPath.of(work_dir) / f"run={rid}",
            tables,
            on_divergence,
            dry_run,
            data_docs,
            config_digest,
            datetime.now(UTC).isoformat(),
            accept_alert=accept_alert,
        )


def runs_of(work_dir: WorkPath | Path | str, dt: date) -> list[RunContext]:
    """The runs of ``dt`` whose work folders are in ``work_dir``, oldest first."""
    runs = [_read(p) for p in WorkPath.of(work_dir).glob("run=*/run.json")]
    return sorted((r for r in runs if r is not None and r.dt == dt), key=lambda r: r.started)


def _read(run_json: WorkPath) -> RunContext | None:
    """The run a ``run.json`` describes, in the folder it is in; None when it is gone or
    unreadable (a folder being removed)."""
    try:
        d = json.loads(run_json.read_text())
    except (OSError, ValueError, StoreError):
        return None
    tables = d.get("tables")
    return RunContext(
        date.fromisoformat(d[DT]),
        d["now_us"],
        d[RUN_ID],
        run_json.parent,
        tuple(tables) if tables is not None else None,
        d.get("on_divergence"),
        bool(d.get("dry_run", False)),
        bool(d.get("data_docs", True)),
        d.get("config_digest"),
        d.get("started", ""),
        d.get("epoch", ""),
        bool(d.get("accept_alert", False)),
    )
