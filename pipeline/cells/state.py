"""The state of a cell table: the purge of expired tombstones (§7), the table
tombstone of a TRUNCATE, and the new state row from the maxima of its slots."""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.cells.writes import greatest, value_columns
from pipeline.config import Table
from pipeline.rowfold import Event
from pipeline.schema import state_schema


def table_tombstone(rows: list[Any], truncs: Sequence[Event], now_us: int) -> dict | None:
    """The table tombstone: the latest of the state's and the run's TRUNCATEs."""
    cands = [
        (r._tomb.ts, r._tomb.deleted_at, 0, -1, r._tomb.event_id or "", r._tomb.origin)
        for r in rows
    ]
    cands += [(t.ts, now_us, 1, t.rank, t.event_id, t.origin) for t in truncs]
    if not cands:
        return None
    ts, deleted_at, _, _, event_id, origin = max(cands)
    return {"ts": ts, "deleted_at": deleted_at, "origin": origin, "event_id": event_id or None}


def purge_cells(prior: DataFrame, table: Table, now_us: int, grace_s: int) -> DataFrame:
    """§7: drop the tombstones whose deletion time is before ``now - gc_grace``: dead
    cells, expired cells (counting from their write time ``expiry - ttl``), the row and
    table tombstones; a row left with nothing disappears."""
    horizon = now_us - grace_s * 1_000_000
    now_s = now_us // 1_000_000

    def expired_old(x: Column) -> Column:
        """An expired TTL write, a tombstone since its write time ``expiry - ttl``."""
        expired = x["ttl"].isNotNull() & (x["expiry"] <= now_s)
        return expired & ((x["expiry"] - x["ttl"]) * 1_000_000 < horizon)

    def keep(x: Column) -> Column:
        old = F.when(x["dead"], x["deleted_at"] < horizon).otherwise(expired_old(x))
        return x.isNotNull() & ~F.coalesce(old, F.lit(False))

    def keep_marker(x: Column) -> Column:  # a marker is never dead
        return x.isNotNull() & ~F.coalesce(expired_old(x), F.lit(False))

    cells = F.col("_cells")
    value_cols = [c for c, _ in value_columns(table)]
    kept = {c: keep(cells[c]) for c in value_cols}
    new_cells = F.when(
        cells.isNotNull(), F.struct(*[F.when(kept[c], cells[c]).alias(c) for c in value_cols])
    )
    marker = F.when(keep_marker(F.col("_marker")), F.col("_marker"))
    tomb = F.when(F.col("_tomb")["deleted_at"] >= horizon, F.col("_tomb"))
    anything = reduce(lambda a, b: a | b, kept.values(), F.lit(False))
    anything = anything | marker.isNotNull() | tomb.isNotNull() | cells.isNull()
    out = prior.select(
        *[c for c in prior.columns if c not in ("_cells", "_marker", "_tomb")],
        new_cells.alias("_cells"),
        marker.alias("_marker"),
        tomb.alias("_tomb"),
    )
    return out.where(anything).select(*prior.columns)


def final_state(table: Table, now_us: int, tt: dict | None) -> tuple[list[Column], Column]:
    """The state row from the slots' maxima ``f_*`` at a key's last row; and whether the
    key keeps a state row at all."""
    now_s = now_us // 1_000_000
    tt_ts = F.lit(tt["ts"] if tt else None).cast("long")
    tomb = F.col("f__tomb")
    tomb_kept = tomb.isNotNull() & F.coalesce(tomb["ts"] > tt_ts, F.lit(True))
    limit = F.greatest(F.when(tomb_kept, tomb["ts"]), tt_ts)

    def kept(x: Column) -> Column:
        return x.isNotNull() & F.coalesce(x["ts"] > limit, F.lit(True))

    def live(x: Column) -> Column:
        return (
            kept(x)
            & ~x["dead"]
            & (x["ttl"].isNull() | F.coalesce(x["expiry_s"] > now_s, F.lit(False)))
        )

    cols = value_columns(table)
    cells = {c: F.col(f"f_{c}") for c, _ in cols}
    marker = F.col("f__marker")
    marker_live = kept(marker) & (
        marker["ttl"].isNull() | F.coalesce(marker["expiry_s"] > now_s, F.lit(False))
    )
    lives = [live(x) for x in cells.values()]
    row_live = reduce(lambda a, b: a | b, lives, marker_live)

    def last_write(x: Column, ok: Column) -> Column:
        return F.when(
            ok,
            F.struct(
                x["ts"].alias("ts"),
                x["is_event"].alias("is_event"),
                x["rank"].alias("rank"),
                x["event_id"].alias("event_id"),
                x["origin"].alias("origin"),
            ),
        )

    latest = greatest(
        [last_write(x, ok) for x, ok in zip(cells.values(), lives, strict=True)]
        + [last_write(marker, marker_live)]
    )
    deletions = [F.when(kept(x) & x["dead"], x["deleted_at"]) for x in cells.values()]
    deletions += [
        F.when(kept(x) & ~x["dead"] & x["ttl"].isNotNull(), (x["expiry_s"] - x["ttl"]) * 1_000_000)
        for x in cells.values()
    ]
    deletions.append(F.when(tomb_kept, tomb["deleted_at"]))
    values = []
    for c, _ct in cols:
        x = cells[c]
        values.append(F.when(live(x), x["value"]).alias(c))
    schema = state_schema(table)

    def stored(c: str, x: Column) -> Column:
        return F.when(
            kept(x),
            F.struct(
                x["value"].alias("value"),
                x["ts"].alias("ts"),
                x["ttl"].alias("ttl"),
                x["expiry_s"].alias("expiry"),
                x["dead"].alias("dead"),
                F.when(x["dead"], x["deleted_at"]).alias("deleted_at"),
                x["origin"].alias("origin"),
                x["event_id"].alias("event_id"),
            ),
        ).alias(c)

    by_name = dict(zip([c for c, _ in cols], values, strict=True))
    out = []
    for f in schema.fields:
        if f.name in table.key:
            out.append(F.col(f"key.{f.name}").alias(f.name))
        elif f.name in by_name:
            out.append(by_name[f.name])
        elif f.name == "_ts":
            out.append(F.when(row_live, latest["ts"]).alias("_ts"))
        elif f.name == "_origin":
            out.append(F.when(row_live, latest["origin"]).alias("_origin"))
        elif f.name == "_event_id":
            out.append(F.when(row_live, latest["event_id"]).alias("_event_id"))
        elif f.name == "_deleted":
            out.append((~row_live).alias("_deleted"))
        elif f.name == "_deleted_at":
            out.append(F.when(~row_live, greatest(deletions)).alias("_deleted_at"))
        elif f.name == "_cells":
            out.append(F.struct(*[stored(c, cells[c]) for c, _ in cols]).alias("_cells"))
        elif f.name == "_marker":
            out.append(
                F.when(
                    kept(marker),
                    F.struct(
                        marker["ts"].alias("ts"),
                        marker["ttl"].alias("ttl"),
                        marker["expiry_s"].alias("expiry"),
                        marker["origin"].alias("origin"),
                        marker["event_id"].alias("event_id"),
                    ),
                ).alias("_marker")
            )
        elif f.name == "_tomb":
            out.append(
                F.when(
                    tomb_kept,
                    F.struct(
                        tomb["ts"].alias("ts"),
                        tomb["deleted_at"].alias("deleted_at"),
                        tomb["origin"].alias("origin"),
                        tomb["event_id"].alias("event_id"),
                    ),
                ).alias("_tomb")
            )
    exists = reduce(lambda a, b: a | b, [kept(x) for x in cells.values()], kept(marker)) | tomb_kept
    return [
        c.cast(f.dataType).alias(f.name) for c, f in zip(out, schema.fields, strict=True)
    ], exists


def table_tombstone_row(spark: SparkSession, table: Table, tt: dict) -> DataFrame:
    schema = state_schema(table)
    values: dict[str, Any] = {f.name: None for f in schema.fields}
    values.update(
        _deleted=True,
        _deleted_at=tt["deleted_at"],
        _ts=tt["ts"],
        _origin=tt["origin"],
        _event_id=tt["event_id"],
        _tomb=(tt["ts"], tt["deleted_at"], tt["origin"], tt["event_id"]),
    )
    return spark.createDataFrame([tuple(values[f.name] for f in schema.fields)], schema)
