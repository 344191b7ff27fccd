"""What a failure of the gate says to do (pipeline/validate/advice.py): a table an
``error`` resolver stopped names the conflict, the resolver and whose it is, the choices
and the command; a failed check a setting decides names the setting; the defaults
publish a divergent night (docs/validation.md#what-a-failure-names)."""

from __future__ import annotations

from pipeline.core.config_load import parse_config
from pipeline.core.policy import ConflictType, DivergencePolicy, FkPolicy
from pipeline.core.summary import Stopped, TableSummary
from pipeline.validate import advice
from tests.helpers import configs
from tests.helpers.fold_helpers import make_config

D = "2026-11-21"
CUSTOMERS = configs.table({"id": "int", "email": "string"}, unique=[["email"]])
COLLISION = Stopped(
    "customers",
    '{"id":2}',
    "multiple_unique_conflicts",
    "pg2-c2",
    "collides on a unique constraint with key(s) [1]",
    "3f0c" * 8,
)


def test_the_defaults_publish_a_divergent_night_and_stop_on_an_orphan():
    config = parse_config(configs.config())
    assert config.on_divergence is DivergencePolicy.WARN
    assert config.on_fk_violation is FkPolicy.FAIL


def test_a_stopped_table_names_the_presets_resolver_the_choices_and_the_command():
    config = parse_config(configs.config({"customers": CUSTOMERS}))
    text = advice.stopped(config.tables["customers"], COLLISION, D)
    assert text.startswith(
        'table customers: multiple_unique_conflicts on key {"id":2} '
        f"(event pg2-c2, conflict {'3f0c' * 8}) met resolver `error` (the postgres preset's): "
        "collides on a unique constraint"
    )
    assert "set `tables.customers.resolvers: {multiple_unique_conflicts: apply | skip}`" in text
    assert text.endswith(f"run the date again: `cdr run --date {D}`")


def test_a_resolver_the_config_set_is_named_as_the_configs():
    table = configs.table(resolvers={"insert_exists": "error"})
    t = parse_config(configs.config(table)).tables["t"]
    stop = Stopped("t", '{"id":1}', "insert_exists", "e1", "r")  # an earlier report: no id
    text = advice.stopped(t, stop, D)
    assert "(event e1) met resolver `error` (set by `tables.t.resolvers`)" in text
    choices = advice.resolver_choices(t, ConflictType.INSERT_EXISTS)
    assert "error" not in choices and "python" not in choices
    assert {"apply", "skip", "latest_timestamp_wins"} <= set(choices)


def test_a_report_without_the_conflict_id_still_reads():
    old = {
        "table": "t",
        "key": "k",
        "conflict_type": "insert_exists",
        "event_id": "e",
        "reason": "r",
    }
    assert TableSummary.from_dict({"stopped": old}).stopped == Stopped(**old)


def test_a_check_a_setting_decides_names_it():
    fail = make_config(on_divergence="fail")
    text = advice.for_check(fail, "convergence.t", "no_divergent_perspective", D)
    assert text is not None and "`on_divergence: warn` (the default)" in text
    assert f"cdr run --date {D} --on-divergence warn" in text
    orphans = advice.for_check(fail, "foreign_keys.orders", "no_orphan", D)
    assert orphans is not None and "`on_fk_violation: fail`" in orphans
    assert "`on_fk_violation: quarantine`" in orphans
    alert = advice.for_check(fail, "alerts.t", "conflict_rate", D)
    assert alert is not None and "--accept-alert" in alert
    assert advice.for_check(fail, "snapshot.t", "key_unique", D) is None
