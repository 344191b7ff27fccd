"""What a run publishes: each output folder of its ``resolved`` folder and the table its
rows go to (``pipeline.publish.commit`` commits them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.core import layout
from pipeline.storage import stats

if TYPE_CHECKING:
    from pipeline.core.config import Config
    from pipeline.storage.workpath import WorkPath

#: a table's state as the fold wrote it (``pipeline.resolve.stage``): its final ``state`` unless
#: the foreign-key step rewrote it
STATE_PRE = "state_pre"


@dataclass(frozen=True)
class Output:
    """A folder of the run's ``resolved`` outputs and the table its files go to."""

    folder: str  # relative to ``resolved``
    path: str  # the table's key in the store
    dated: bool  # partitioned by ``dt``


def outputs(config: Config) -> list[Output]:
    """Every output a publish may commit."""

    out = [Output(stats.FOLDER, stats.PATH, True)]  # conflict stats
    if config.cdc.enabled:
        out += [Output(f"cdc/{n}", layout.cdc_table_dir(n), False) for n in layout.CDC_TABLES]
    for t in config.tables:
        out += [Output(f"{t}/{k}", layout.table_path(t, k), True) for k in layout.DATED]
        out.append(Output(f"{t}/{layout.STATE}", layout.table_path(t, layout.STATE), False))
        if config.cdc.enabled:
            out.append(Output(f"cdc/{t}/log", layout.cdc_log_path(t), True))
        if config.tables[t].history is not None:
            out.append(Output(f"{t}/{layout.HISTORY}", layout.table_path(t, layout.HISTORY), False))
        out.append(Output(f"{t}/{layout.SNAPSHOT}", layout.table_path(t, layout.SNAPSHOT), False))
    return out


def final_state(table_out: WorkPath) -> WorkPath:
    """Where a table's final state is in the run's ``resolved`` folder: ``state`` when the
    foreign-key step rewrote it, else where the fold wrote it (never moved: on S3 a move
    is a copy of every file, signed by whoever moves it)."""
    rewritten = table_out / layout.STATE
    return rewritten if rewritten.parquet_files() else table_out / STATE_PRE


def located(resolved: WorkPath, folder: str) -> WorkPath:
    """Where the files of an output ``folder`` are in the run's ``resolved`` folder."""
    table, _, kind = folder.partition("/")
    return final_state(resolved / table) if kind == layout.STATE else resolved / folder
