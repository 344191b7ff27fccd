"""The CDC log end to end (docs/cdc.md): two ``cdr run``s on generated exports of a row table
(unique constraint, delta column) and a cell table (composite key, TTLs, nulls), with a
topology change between them and late events; then a rerun. Read back from the published
files as a consumer would (``cdc_consumer``): every stream id belongs to the generation
operating at its entry's time, late events land in the old generation, replaying the log
gives the published snapshot, and a rerun writes the same stream ids and log rows.
Also: stream ids computed on Spark against the driver's tokens, and the timeuuid order."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from pyspark.sql import functions as F

from pipeline.changes.cdc import stream_id_column, timeuuid
from pipeline.changes.streams import Generation, Generations, Topology, next_generations, vnode_ends
from pipeline.core.config_load import parse_config
from pipeline.spark.schema import key_struct_type
from tests.helpers import configs
from tests.helpers.cassandra import cassandra_bytes, driver_token, random_value
from tests.helpers.cdc_consumer import Consumer, micros, time_order
from tests.helpers.cdc_store import CONFIG, D1, D2, keyed, start_of


def test_a_topology_change_starts_a_generation(two_days):
    gens = two_days["gens"]
    assert [(g.time, g.expired) for g in gens] == [(0, start_of(D2)), (start_of(D2), None)]
    assert gens[0].topology == Topology(vnode_ends(8), 2, 0)
    assert gens[1].topology == Topology(vnode_ends(12), 3, 12)
    cdc = two_days["report"]["cdc"]
    assert cdc["new_generation"] and cdc["generation"] == start_of(D2) and cdc["streams"] == 36


def test_every_entry_is_in_the_stream_of_its_token_in_the_generation_of_its_time(two_days):
    lookup = Generations(two_days["gens"])
    late = 0
    for table, rows in two_days["day2"].items():
        spec = CONFIG["tables"][table]
        kinds = [str(parse_config(CONFIG).tables[table].column(c).type) for c in spec["key"]]
        for r in rows:
            ts = micros(r["cdc$time"])
            g = lookup.gens[int(lookup.operating([ts])[0])]
            token = driver_token(cassandra_bytes([r[c] for c in spec["key"]], kinds))
            assert r["cdc$stream_id"] == g.stream_of(token).to_bytes(), (table, r)
            late += ts < start_of(D2)
    assert late > 0, "no late event: the old generation was not exercised"


@pytest.mark.parametrize("table", sorted(CONFIG["tables"]))
def test_replaying_the_log_gives_the_snapshot(two_days, table: str):
    spec = CONFIG["tables"][table]
    columns = list(spec["columns"])
    consumer = Consumer(spec["key"], columns)
    consumer.seed(two_days["base"][table])
    for d, log in ((D1, two_days["day1"][table]), (D2, two_days["day2"][table])):
        consumer.apply_log(log)  # also checks every pre- and post-image on day 2
        want = keyed(two_days["snapshots"][table][d], spec["key"], columns)
        assert consumer.view(start_of(d) + 86_400_000_000) == want, d
    assert consumer.applied > 100


def test_replaying_from_the_previous_snapshot(two_days):
    """For a row table the previous snapshot is all a consumer needs."""
    spec = CONFIG["tables"]["accounts"]
    columns = list(spec["columns"])
    consumer = Consumer(spec["key"], columns)
    consumer.seed(two_days["snapshots"]["accounts"][D1])
    consumer.apply_log(two_days["day2"]["accounts"])
    want = keyed(two_days["snapshots"]["accounts"][D2], spec["key"], columns)
    assert consumer.view(start_of(D2) + 86_400_000_000) == want


def test_one_entry_per_applied_event(two_days):
    tables = two_days["report"]["tables"]
    for table, rows in two_days["day2"].items():
        events = {r["cdc$time"] for r in rows if r["cdc$operation"] in (1, 2, 3, 4)}
        applied, discarded = tables[table]["applied"], tables[table]["discarded"]
        if table == "sessions":
            assert len(events) == applied
        else:  # a discarded UPDATE still adds its delta (docs/rules.md#delta-columns): an entry too
            assert applied <= len(events) <= applied + discarded
        ends = [r for r in rows if r["cdc$end_of_batch"]]
        assert len(ends) >= len(events)


def test_batches(two_days):
    """Per stream and event: pre-image, change, post-image numbered from 0, the last
    one ending the batch."""
    by_batch: dict[tuple, list[dict[str, Any]]] = {}
    for r in two_days["day2"]["accounts"]:
        by_batch.setdefault((r["cdc$stream_id"], r["cdc$time"]), []).append(r)
    shapes = set()
    for rows in by_batch.values():
        rows.sort(key=lambda r: r["cdc$batch_seq_no"])
        assert [r["cdc$batch_seq_no"] for r in rows] == list(range(len(rows)))
        assert [r["cdc$end_of_batch"] for r in rows] == [False] * (len(rows) - 1) + [True]
        shapes.add(tuple(r["cdc$operation"] for r in rows))
    assert {(0, 1, 9), (2, 9), (0, 3)} <= shapes, shapes


def test_a_rerun_writes_the_same_log(two_days):
    assert two_days["gens_after_rerun"] == two_days["gens"]
    for table in CONFIG["tables"]:
        first = sorted(two_days["day2"][table], key=repr)
        again = sorted(two_days["rerun"][table], key=repr)
        assert first == again, table


# ---------------------------------------------------------------------- on Spark


def test_stream_ids_on_spark_use_the_drivers_tokens(spark):
    rnd = random.Random(11)
    shapes = {"a": ["string"], "b": ["bigint", "string"], "c": ["uuid", "date", "timestamp"]}
    gens, _ = next_generations(
        next_generations([], Topology(vnode_ends(8), 4, 12), 0)[0],
        Topology((-(2**40), 0, 2**40), 2, 0),
        start_of(D2),
    )
    lookup = Generations(gens)
    for shape in shapes.values():
        cols = {f"k{i}": k for i, k in enumerate(shape)}
        table = parse_config(configs.config(configs.table(cols, cols), replicas=("r",))).tables["t"]
        rows = [
            (rnd.choice([start_of(D1), start_of(D2) + 5]), *[random_value(k, rnd) for k in shape])
            for _ in range(500)
        ]
        key_t = key_struct_type(table)
        df = spark.createDataFrame(rows, f"ts long, {', '.join(f.simpleString() for f in key_t)}")
        got = df.select(F.struct(*cols).alias("key"), "ts").select(
            stream_id_column(table, lookup).alias("s")
        )
        for (ts, *key), g in zip(rows, got.collect(), strict=True):
            gen: Generation = lookup.gens[int(lookup.operating([ts])[0])]
            want = gen.stream_of(driver_token(cassandra_bytes(list(key), list(shape))))
            assert bytes(g.s) == want.to_bytes(), (shape, key)


def test_timeuuid_orders_like_the_canonical_order(spark):
    rnd = random.Random(2)
    ts0 = start_of(D2)
    rows = [
        (ts0 + rnd.choice([0, 1, 999_999]), rnd.randint(-1, 5), rnd.randint(0, 3), f"e{i}")
        for i in range(400)
    ]
    df = spark.createDataFrame(rows, "ts long, rank int, ordinal int, event_id string")
    got = df.select(
        "ts",
        "rank",
        "ordinal",
        timeuuid(F.col("ts"), F.col("rank"), F.col("ordinal"), F.col("event_id")).alias("u"),
    ).collect()
    for r in got:
        u = uuid.UUID(r.u)
        assert u.version == 1 and u.variant == uuid.RFC_4122
        assert micros(r.u) == r.ts
        assert all(b < 0x80 for b in u.bytes[9:])  # signed and unsigned orders agree
    by_uuid = sorted(got, key=lambda r: time_order(r.u))
    by_position = sorted(got, key=lambda r: (r.ts, r.rank, r.ordinal))
    distinct = {(r.ts, r.rank, r.ordinal) for r in got}
    assert len(distinct) < len(got)  # some share a position: the hash bits tell them apart
    assert [(r.ts, r.rank, r.ordinal) for r in by_uuid] == [
        (r.ts, r.rank, r.ordinal) for r in by_position
    ]
    assert len({r.u for r in got}) == len(got)
