"""cdr.yaml is parsed once into frozen models; every mistake is reported at once, with its
path in the file (docs/configuration.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from pipeline.core.config import History
from pipeline.core.config_load import load_config, parse_config
from pipeline.core.errors import ConfigError
from pipeline.core.kinds import Kind, parse_column_type
from pipeline.core.policy import ConflictType, Resolver, TieBreak
from tests.helpers import configs

FORMATS_EXAMPLE = """
store: s3://replica-exports/prod
replicas:
  - {id: pub, system_id: 7301}
  - {id: sub, system_id: 7302}
defaults: {policy: postgres}
max_clock_skew_seconds: 300
gc_grace_seconds: 864000
on_divergence: fail
on_fk_violation: fail
tables:
  products:
    key: [product_no]
    columns: {product_no: int, name: string, price: decimal(10,2)}
  orders:
    key: [order_id]
    columns: {order_id: int, product_no: int, quantity: int}
    not_null: [product_no]
    foreign_keys: [{columns: [product_no], references: products}]
  accounts:
    key: [id]
    columns: {id: bigint, owner: string, balance: bigint}
    unique: [[owner]]
    delta: [balance]
    policy: postgres
    resolvers: {update_deleted: latest_timestamp_wins}
    defaults: {owner: "unknown"}
  sessions:
    key: [user_id, device]
    columns: {user_id: bigint, device: string, token: string}
    policy: scylla
cdc:
  enabled: true
  vnodes: 16
  shards: 4
  sharding_ignore_msb: 12
"""


def test_the_formats_md_example_loads(tmp_path: Path):
    p = tmp_path / "cdr.yaml"
    p.write_text(FORMATS_EXAMPLE)
    cfg = load_config(p)
    acc = cfg.tables["accounts"]
    assert acc.resolvers[ConflictType.UPDATE_DELETED] is Resolver.LATEST_TIMESTAMP_WINS
    assert acc.resolvers[ConflictType.INSERT_EXISTS] is Resolver.LATEST_TIMESTAMP_WINS
    assert acc.defaults == {"owner": "unknown"}
    assert str(cfg.tables["products"].column("price").type) == "decimal(10,2)"
    assert cfg.tables["sessions"].granularity.value == "cell"
    assert cfg.cdc.shards == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tables["orders"].key = ("x",)  # type: ignore[misc]


def test_every_mistake_is_reported_at_once_with_its_path():
    data = yaml.safe_load(FORMATS_EXAMPLE)
    data["tables"]["orders"]["foreign_keys"][0]["references"] = "product"
    data["tables"]["orders"]["key"] = ["order_no"]
    data["tables"]["accounts"]["resolvers"] = {"update_missing": "latest_timestamp_wins"}
    data["tables"]["sessions"]["delta"] = ["token"]
    data["replicas"][1]["system_id"] = 7301
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    problems = e.value.problems
    assert "tables.orders.foreign_keys[0].references: no table 'product'" in problems
    assert any(p.startswith("tables.orders.key[0]: no column 'order_no'") for p in problems)
    assert any(
        p.startswith(
            "tables.accounts.resolvers.update_missing: resolver "
            "'latest_timestamp_wins' is not allowed"
        )
        for p in problems
    )
    assert any(p.startswith("tables.sessions.delta:") for p in problems)
    assert any(p.startswith("replicas[1].system_id") for p in problems)
    assert len(problems) >= 5


def test_structural_mistakes_name_their_path():
    with pytest.raises(ConfigError) as e:
        parse_config(
            configs.config(
                configs.table({"id": "int"}, polcy="x"),
                replicas=configs.replicas(a=-1),
                on_divergence="maybe",
            )
        )
    text = str(e.value)
    assert "replicas[0].system_id" in text
    assert "tables.t.polcy: unknown key" in text
    assert "on_divergence" in text


def test_a_table_without_key_is_refused():
    with pytest.raises(ConfigError, match=r"tables\.t\.key: a table needs a key"):
        parse_config(configs.config({"t": {"columns": {"id": "int"}}}, replicas=("a",)))


def test_scope_transaction_needs_delete_wins():
    with pytest.raises(ConfigError, match=r"tables\.t\.scope"):
        parse_config(
            configs.config(configs.table({"id": "int"}, scope="transaction"), replicas=("a",))
        )


def test_defaults_must_fit_their_column_type():
    with pytest.raises(ConfigError, match=r"tables\.t\.defaults\.n"):
        parse_config(
            configs.config(
                configs.table({"id": "int", "n": "int"}, defaults={"n": "seven"}), replicas=("a",)
            )
        )


def test_tie_ranks_put_the_tie_break_winner_last():
    cfg = parse_config(
        configs.config(configs.table({"id": "int"}), replicas=configs.replicas(a=5, b=9))
    )
    assert cfg.tie_ranks(TieBreak.HIGHER_SYSTEM_ID) == {"a": 0, "b": 1}
    assert cfg.tie_ranks(TieBreak.LOWER_SYSTEM_ID) == {"b": 0, "a": 1}


@pytest.mark.parametrize("text", ["int", "decimal(10,2)", "DECIMAL(38, 0)", "uuid", "timestamp"])
def test_column_types(text):
    assert parse_column_type(text).kind in set(Kind)


@pytest.mark.parametrize("text", ["integr", "decimal", "decimal(40,2)", "decimal(4,5)"])
def test_bad_column_types(text):
    with pytest.raises(ValueError):
        parse_column_type(text)


def test_missing_file_and_bad_yaml(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"no such file in .*cdr init --from-postgres"):
        load_config(tmp_path / "nope.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("tables: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


def test_cdc_topology_mistakes():
    base = configs.config(configs.table({"id": "int"}), replicas=("a",))
    with pytest.raises(ConfigError) as e:
        parse_config({**base, "cdc": {"enabled": True, "vnodes": 65536, "shards": 1024}})
    assert "cdc: 65536 token ranges x 1024 shards" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config({**base, "cdc": {"vnodes": 4, "token_ring": [1, 0, 0]}})
    text = str(e.value)
    assert "give either vnodes or token_ring" in text
    assert "cdc.token_ring: range-end tokens must be sorted and distinct" in text
    many = configs.replicas(**{f"r{i}": i for i in range(501)})
    with pytest.raises(ConfigError, match="replicas: the CDC log orders at most 500"):
        parse_config({**base, "replicas": many, "cdc": {"enabled": True}})
    c = parse_config({**base, "cdc": {"enabled": True, "token_ring": [-5, 7]}}).cdc
    assert (c.token_ring, c.shards, c.sharding_ignore_msb) == ((-5, 7), 1, 12)


def _formats_example() -> dict:
    return yaml.safe_load(FORMATS_EXAMPLE)


@pytest.mark.parametrize("schedule", ["0 2 * * *", "30 3 * * 1-5", "*/15 * * * *", "@daily"])
def test_schedules(schedule):
    assert parse_config({**_formats_example(), "schedule": schedule}).schedule == schedule


@pytest.mark.parametrize("schedule", ["every night", "0 2 * *", "0 2 * * * *", "0 2 ; * *"])
def test_bad_schedules_are_refused(schedule):
    with pytest.raises(ConfigError, match=r"schedule: .* is not a cron expression"):
        parse_config({**_formats_example(), "schedule": schedule})


def test_wait_for_exports_defaults_and_limits():
    config = parse_config(_formats_example())
    assert (
        config.wait_for_exports.timeout_minutes,
        config.wait_for_exports.poke_interval_seconds,
    ) == (
        360,
        300,
    )
    with pytest.raises(ConfigError, match=r"wait_for_exports\.poke_interval_seconds"):
        parse_config({**_formats_example(), "wait_for_exports": {"poke_interval_seconds": 1}})


def test_deadline_minutes_is_off_by_default_and_positive():
    assert parse_config(_formats_example()).deadline_minutes is None
    config = parse_config({**_formats_example(), "deadline_minutes": 240})
    assert config.deadline_minutes == 240
    # a scheduling setting: a run's stages agree across a change of it
    assert config.digest() == parse_config(_formats_example()).digest()
    with pytest.raises(ConfigError, match=r"deadline_minutes: .*greater than or equal to 1"):
        parse_config({**_formats_example(), "deadline_minutes": 0})


def test_select_adds_the_tables_foreign_keys_reference_and_overrides():
    config = parse_config(_formats_example())
    orders = config.select(["orders"], "warn")
    assert set(orders.tables) == {"products", "orders"}
    assert orders.on_divergence.value == "warn" and config.on_divergence.value == "fail"
    assert set(config.select(["accounts"]).tables) == {"accounts"}
    assert config.select(None) is config
    allowed = config.select(None, allow_missing_exports=True)  # the DAG form's switch
    assert allowed.allow_missing_exports and not config.allow_missing_exports
    with pytest.raises(ConfigError) as e:
        config.select(["orders", "invoices"], "ignore")
    assert "tables: no table 'invoices'" in str(e.value)
    assert "on_divergence: 'ignore' is not fail or warn" in str(e.value)


def _priority_config(priority=None, resolvers=None, **top):
    table = configs.table(resolvers=resolvers or {"update_differ": "priority_wins"})
    data = configs.config(table, replicas=("a", "b"), **top)
    if priority is not None:
        data["priority"] = priority
    return parse_config(data)


def test_priority_wins_reads_the_top_level_priority():
    """docs/rules.md#priority: ``priority`` ranks the replicas, most trusted first; every table
    carries it for the fold."""
    config = _priority_config(["b", "a"])
    t = config.tables["t"]
    assert t.resolvers[ConflictType.UPDATE_DIFFER] is Resolver.PRIORITY_WINS
    assert t.priority == ("b", "a")


@pytest.mark.parametrize(
    ("priority", "resolvers", "message"),
    [
        (
            None,
            None,
            r"priority: missing: priority_wins \(tables\.t: update_differ\) needs every "
            r"replica ranked, most trusted first, e\.g\. priority: \[a, b\]",
        ),
        (["a"], None, r"priority: missing replica\(s\) 'b': list every replica once"),
        (["a", "b", "c"], None, r"priority\[2\]: no replica 'c' \(replicas: a, b\)"),
        (["a", "b", "a"], None, r"priority\[2\]: replica 'a' is listed twice"),
        (
            ["a", "b"],
            {"update_missing": "priority_wins"},
            r"tables\.t\.resolvers\.update_missing: resolver 'priority_wins' is not allowed "
            r"for update_missing; allowed: apply_or_error, apply_or_skip, error, skip",
        ),
    ],
    ids=["missing", "a_replica_missing", "unknown_replica", "listed_twice", "not_allowed"],
)
def test_priority_mistakes_name_the_bad_value(priority, resolvers, message):
    with pytest.raises(ConfigError, match=message):
        _priority_config(priority, resolvers)


def test_priority_wins_through_defaults_needs_priority_too():
    with pytest.raises(ConfigError, match=r"priority: missing: priority_wins \(tables\.t: "):
        _priority_config(
            None,
            {"insert_exists": "skip"},
            defaults={"resolvers": {"pkey_exists": "priority_wins"}},
        )


def _one_table(columns: dict[str, str], **table):
    """A config of one table ``t`` keyed by ``id``, with ``table``'s settings."""
    t = configs.table({"id": "int", **columns}, **table)
    return parse_config(configs.config(t, replicas=("a",)))


def _ordered(order_by: str, **table):
    columns = {"v": "string", "at": "timestamp", "m": "decimal(9,2)"}
    return _one_table(columns, order_by=order_by, **table)


@pytest.mark.parametrize("column", ["at", "m", "id"])
def test_order_by_names_an_orderable_column(column):
    assert _ordered(column).tables["t"].order_by == column


@pytest.mark.parametrize(
    ("order_by", "table", "message"),
    [
        (
            "v",
            {},
            r"tables\.t\.order_by: column 'v' is string; order_by needs one of: "
            r"timestamp, bigint, int, decimal",
        ),
        ("nope", {}, r"tables\.t\.order_by: no column 'nope' in tables\.t\.columns"),
        (
            "at",
            {"policy": "scylla"},
            r"tables\.t\.order_by: not allowed on a scylla \(cell-granularity\) table",
        ),
    ],
    ids=["wrong_type", "unknown_column", "cell_table"],
)
def test_order_by_mistakes_name_the_bad_value(order_by, table, message):
    with pytest.raises(ConfigError, match=message):
        _ordered(order_by, **table)


def _grouped(groups, **table):
    columns = {"qty": "int", "name": "string", "note": "string"}
    return _one_table(columns, column_groups=groups, **table)


def test_column_groups_and_the_implicit_group_of_the_rest():
    """docs/rules.md#column-groups: the columns in no group form one implicit group, last."""
    t = _grouped({"stock": ["qty"], "label": ["name"]}).tables["t"]
    assert t.column_groups == (("stock", ("qty",)), ("label", ("name",)), ("_other", ("note",)))
    t = _grouped({"all": ["qty", "name", "note"]}).tables["t"]
    assert t.column_groups == (("all", ("qty", "name", "note")),)


@pytest.mark.parametrize(
    ("groups", "table", "message"),
    [
        (
            {"stock": ["qty"], "label": ["name", "qty"]},
            {},
            r"tables\.t\.column_groups\.label: column 'qty' is already in group 'stock'",
        ),
        ({"stock": ["qtty"]}, {}, r"column_groups\.stock: no column 'qtty' in tables\.t\.columns"),
        ({"stock": ["id"]}, {}, r"column_groups\.stock: key column 'id' cannot be in a group"),
        ({"stock": []}, {}, r"column_groups\.stock: an empty group"),
        ({"_other": ["qty"]}, {}, r"column_groups\._other: a group name is a letter"),
        (
            {"stock": ["qty"]},
            {"policy": "delete_wins"},
            r"tables\.t\.column_groups: only on a postgres table, not delete_wins",
        ),
    ],
    ids=["in_two_groups", "unknown_column", "key_column", "empty", "reserved_name", "policy"],
)
def test_column_group_mistakes_name_the_bad_value(groups, table, message):
    with pytest.raises(ConfigError, match=message):
        _grouped(groups, **table)


@pytest.mark.parametrize(
    ("history", "want"),
    [
        (False, None),
        (True, History()),
        ({}, History()),
        ({"track": ["qty"]}, History(frozenset({"qty"}))),
    ],
)
def test_history_and_its_tracked_columns(history, want):
    """docs/outputs.md#history, on a row or a cell table."""
    columns = {"qty": "int", "name": "string"}
    assert _one_table(columns, history=history).tables["t"].history == want
    cells = _one_table(columns, history=history, policy="scylla")
    assert cells.tables["t"].history == want


@pytest.mark.parametrize(
    ("history", "message"),
    [
        ({"track": []}, r"tables\.t\.history\.track: an empty list \(leave track out"),
        ({"track": ["qtty"]}, r"history\.track\[0\]: no column 'qtty' in tables\.t\.columns"),
        ({"track": ["id"]}, r"history\.track\[0\]: key column 'id': a key change always opens"),
        ({"track": ["qty", "qty"]}, r"history\.track\[1\]: column 'qty' is listed twice"),
        ({"tracks": ["qty"]}, r"tables\.t\.history\.tracks: unknown key"),
        (
            "yes",
            r"tables\.t\.history: Value error, history is true, false or \{track: \[columns\]\}",
        ),
    ],
    ids=["empty", "unknown_column", "key_column", "twice", "unknown_key", "not_a_mapping"],
)
def test_history_mistakes_name_the_bad_value(history, message):
    with pytest.raises(ConfigError, match=message):
        _one_table({"qty": "int"}, history=history)


def _nulls(table=None, top=None, columns=None):
    """Two tables, ``t`` (row) and ``c`` (cell), with ``ignore_null_updates`` given to ``t``
    (``table``) and at the top level (``top``)."""
    t = configs.table(columns or {"id": "int", "qty": "int", "name": "string"})
    if table is not None:
        t["ignore_null_updates"] = table
    c = configs.table({"id": "int", "qty": "int", "tag": "string"}, policy="scylla")
    cfg = configs.config(t, replicas=("a",))
    cfg["tables"]["c"] = c
    if top is not None:
        cfg["ignore_null_updates"] = top
    return parse_config(cfg)


@pytest.mark.parametrize(
    ("table", "top", "t_nulls"),
    [
        (None, None, set()),
        (True, None, {"qty", "name"}),
        (["name"], None, {"name"}),
        (None, True, {"qty", "name"}),
        (None, ["qty", "tag"], {"qty"}),
        (False, True, set()),
        (["qty"], ["name"], {"qty"}),
    ],
    ids=["off", "table_true", "table_list", "top_true", "top_list", "table_false", "table_wins"],
)
def test_ignore_null_updates_per_table_over_the_top_level(table, top, t_nulls):
    """docs/rules.md#ignore-null-updates: a table's own setting, else the top level's (a
    list there applies to the tables that have its columns); a cell table takes none."""
    config = _nulls(table, top)
    assert config.tables["t"].ignore_nulls == t_nulls
    assert config.tables["c"].ignore_nulls == set()


@pytest.mark.parametrize(
    ("table", "top", "message"),
    [
        (["nope"], None, r"tables\.t\.ignore_null_updates\[0\]: no column 'nope' in tables\.t"),
        (["id"], None, r"tables\.t\.ignore_null_updates\[0\]: key column 'id'"),
        (["qty", "qty"], None, r"ignore_null_updates\[1\]: column 'qty' is listed twice"),
        ([], None, r"tables\.t\.ignore_null_updates: an empty list"),
        (None, ["nope"], r"ignore_null_updates\[0\]: no table has a value column 'nope'"),
        (None, ["id"], r"ignore_null_updates\[0\]: no table has a value column 'id'"),
        ("sometimes", None, r"tables\.t\.ignore_null_updates"),
    ],
    ids=["unknown", "key", "twice", "empty", "top_unknown", "top_key", "not_a_list"],
)
def test_ignore_null_updates_mistakes_name_the_column(table, top, message):
    with pytest.raises(ConfigError, match=message):
        _nulls(table, top)


def test_ignore_null_updates_is_refused_on_a_cell_table():
    cfg = configs.config(
        configs.table({"id": "int", "v": "int"}, policy="scylla", ignore_null_updates=True),
        replicas=("a",),
    )
    with pytest.raises(ConfigError, match=r"tables\.t\.ignore_null_updates: not allowed on a cell"):
        parse_config(cfg)


def _merging(merge, policy="postgres", **table):
    columns = {"id": "int", "score": "bigint", "price": "decimal(10,2)", "seen": "timestamp"}
    columns |= {"born": "date", "ratio": "double", "name": "string", "ok": "boolean"}
    columns |= {"parent": "int", "rev": "int", "qty": "int"}
    t = configs.table(columns, policy=policy, merge=merge, **table)
    cfg = configs.config(t, replicas=("a",))
    cfg["tables"]["p"] = configs.table({"id": "int"})
    return parse_config(cfg)


def test_merge_reads_max_and_min_on_numeric_date_and_timestamp_columns():
    """docs/rules.md#merge-functions: every ordered type may be merged."""
    merge = {"score": "max", "price": "min", "seen": "max", "born": "min", "ratio": "max"}
    got = _merging(merge).tables["t"].merge
    assert {c: f.value for c, f in got.items()} == merge
    assert _merging({}).tables["t"].merge == {}


@pytest.mark.parametrize(
    ("merge", "table", "message"),
    [
        ({"id": "max"}, {}, r"tables\.t\.merge\.id: column 'id' is a key column"),
        ({"rev": "max"}, {"order_by": "rev"}, r"merge\.rev: column 'rev' is the order_by column"),
        ({"qty": "max"}, {"delta": ["qty"]}, r"merge\.qty: column 'qty' is a delta column"),
        ({"score": "min"}, {"unique": [["score"]]}, r"merge\.score: column 'score' is a unique"),
        (
            {"parent": "max"},
            {"foreign_keys": [{"columns": ["parent"], "references": "p"}]},
            r"merge\.parent: column 'parent' is a foreign-key column",
        ),
        ({"name": "max"}, {}, r"merge\.name: column 'name' is string; merge needs one of: int"),
        ({"ok": "min"}, {}, r"merge\.ok: column 'ok' is boolean; merge needs one of"),
        ({"score": "sum"}, {}, r"merge\.score: merge function 'sum': one of max, min"),
        ({"nope": "max"}, {}, r"merge\.nope: no column 'nope' in tables\.t\.columns"),
    ],
    ids=[
        "key",
        "order_by",
        "delta",
        "unique",
        "foreign_key",
        "string",
        "boolean",
        "sum",
        "unknown",
    ],
)
def test_merge_mistakes_name_the_column(merge, table, message):
    with pytest.raises(ConfigError, match=message):
        _merging(merge, **table)


def test_merge_is_refused_on_a_cell_table():
    with pytest.raises(ConfigError, match=r"tables\.t\.merge: not allowed on a cell-granularity"):
        _merging({"score": "max"}, policy="scylla")


#: docs/configuration.md#column-names: names a PostgreSQL table may have that the published
#: tables cannot hold as they are, and why each is refused
UNHOLDABLE = {
    "Order Date": "it holds a space",
    "a.b": "it holds '.'",
    "price-usd": "it holds '-'",
    "1st": "it starts with a digit",
    "_ts": "the published tables keep their own '_ts'",
    "_DELETED": "the published tables keep their own '_DELETED'",
    "dt": "the published tables keep their own 'dt'",
    "_valid_from": "the published tables keep their own '_valid_from'",
    "cdc$time": "names starting with __cdr or cdc$ are the pipeline's own",
    "ID": "it equals column 'id' but for case",
}


@pytest.mark.parametrize("name", sorted(UNHOLDABLE))
def test_a_column_name_the_tables_cannot_hold_is_refused_with_the_as_that_would(name):
    """Each is refused at load, naming the column, why, and an ``as`` that the published
    tables hold; with that ``as`` the config loads, and the column keeps its exported
    name for the exports' records."""
    columns = {"id": "int", name: "string"}
    with pytest.raises(ConfigError) as e:
        parse_config(configs.config(configs.table(columns)))
    said = str(e.value)
    assert f"tables.t.columns.{name}: {name!r} cannot name a column" in said
    assert UNHOLDABLE[name] in said
    hint = said.split("as: ")[1].rstrip("}")
    columns[name] = {"type": "string", "as": hint}
    table = parse_config(configs.config(configs.table(columns))).tables["t"]
    assert table.column_names == ("id", hint) and table.exported(hint) == name
    assert table.renamed == {name: hint}


def test_settings_name_columns_as_published_and_an_as_must_be_holdable_and_unique():
    cols = {"Order Id": {"type": "int", "as": "order_id"}, "v": "string"}
    table = parse_config(configs.config(configs.table(cols, key=["order_id"]))).tables["t"]
    assert table.key == ("order_id",) and table.exported("order_id") == "Order Id"
    with pytest.raises(ConfigError, match=r"is published as 'order_id'"):
        parse_config(configs.config(configs.table(cols, key=["Order Id"])))
    for bad, why in (
        ({"id": "int", "x": {"type": "int", "as": "V"}, "v": "string"}, "exported as 'v'"),
        ({"id": "int", "x": {"type": "int", "as": "a b"}}, "tables.t.columns.x.as: 'a b'"),
        ({"id": "int", "x": {"type": "int", "as": "ID"}}, "equals column 'id' but for case"),
    ):
        with pytest.raises(ConfigError, match=why):
            parse_config(configs.config(configs.table(bad)))


def test_every_column_a_published_table_holds_beside_a_tables_own_is_reserved():
    """The reserved names (``columns.RESERVED``) are those the state, snapshot and history
    schemas put beside a table's columns: a column named so would be ambiguous."""
    from pipeline.changes.history import history_schema
    from pipeline.core.columns import RESERVED
    from pipeline.spark.schema import snapshot_schema, state_schema

    for cfg in (configs.table(), configs.table(policy="scylla"),
                configs.table({"id": "int", "v": "string", "w": "string"},
                              column_groups={"g": ["v"]})):  # fmt: skip
        table = parse_config(configs.config(cfg)).tables["t"]
        for schema in (state_schema(table), snapshot_schema(table), history_schema(table)):
            beside = set(schema.names) - set(table.column_names)
            assert beside <= RESERVED, beside - RESERVED


def test_the_dags_config_is_cdr_config_or_says_to_set_it(tmp_path, monkeypatch):
    """docs/airflow.md#settings: the DAGs read ``$CDR_CONFIG``, else ``cdr.yaml`` beside
    their folder; without either, the error says what to set."""
    from pipeline.core.config_load import load_dag_config
    from tests.helpers import configs

    dags = tmp_path / "dags"
    dags.mkdir()
    monkeypatch.delenv("CDR_CONFIG", raising=False)
    with pytest.raises(ConfigError, match=r"CDR_CONFIG is not set") as err:
        load_dag_config(dags)
    assert "set CDR_CONFIG to the path of cdr.yaml (docs/airflow.md#settings)" in str(err.value)
    assert str(tmp_path / "cdr.yaml") in str(err.value)  # where it looked
    monkeypatch.setenv("CDR_CONFIG", str(tmp_path / "gone.yaml"))
    with pytest.raises(ConfigError, match=r"CDR_CONFIG=.*gone\.yaml: no such file; set CDR_"):
        load_dag_config(dags)
    configs.write(tmp_path / "cdr.yaml", configs.config(), store="file:///s")
    monkeypatch.delenv("CDR_CONFIG")
    assert load_dag_config(dags).store == "file:///s"  # beside the dags folder
    monkeypatch.setenv("CDR_CONFIG", str(tmp_path / "cdr.yaml"))
    assert load_dag_config(dags).store == "file:///s"
