"""docs/operations.md#metrics, E13: the counters never go back. Thirty nights, then a
rerun of the last with fewer conflicts: scraped before and after it (the textfile read
by Prometheus' own parser), no counter sample decreases, and ``increase()`` over the two
scrapes is the rerun's own work. The rule before (``conflict_stats`` summed over every
date, a rerun replacing its date's share) made the counters go down there, which
Prometheus reads as a reset: the documented alerts would have fired on it; they do not
now. Whole runs: tests/spark/test_metrics.py."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import date, timedelta

from prometheus_client.parser import text_string_to_metric_families

from pipeline.publish import metrics as M
from pipeline.storage.runs_table import RunRow
from tests.helpers import REPO
from tests.unit.test_metrics import _row, _stats

Series = dict[str, dict[tuple, float]]
T = "products"
APPLIED = ("update_differ", "apply_remote", "applied")
CONVERTED = ("insert_exists", "latest_timestamp_wins", "converted_to_update")
NIGHTS = [date(2026, 10, 1) + timedelta(days=i) for i in range(30)]


def _run(run_id: str, dt: date, conflicts: dict, events: int, lost: int, **kw) -> RunRow:
    own = [[T, *key, n] for key, n in conflicts.items()]
    tables = {T: {"distinct_events": events, "lost_writes": lost}}
    return _row(run_id, dt, tables, None, own, **kw)


def _night_stats(run_id: str, dt: date, conflicts: dict, events: int, lost: int) -> list[dict]:
    rows = _stats(run_id, dt, T, events, conflicts)
    return [r | {"count": lost} if r["kind"] == "lost_writes" else r for r in rows]


def _store() -> tuple[list[RunRow], list[dict], dict]:
    """Thirty nights of 40 conflicts, 400 events, 8 lost writes; and the conflicts of a
    rerun of the last (30)."""
    nightly = {APPLIED: 30, CONVERTED: 10}
    runs = [_run(f"n{i}", d, nightly, 400, 8) for i, d in enumerate(NIGHTS)]
    stats = [r for i, d in enumerate(NIGHTS) for r in _night_stats(f"n{i}", d, nightly, 400, 8)]
    rerun = {APPLIED: 25, CONVERTED: 5}
    return runs, stats, rerun


def _scrape(runs: list[RunRow], stats: list[dict]) -> Series:
    """The counters of the textfile, as Prometheus' parser reads them."""
    out: Series = {}
    for family in text_string_to_metric_families(M.textfile(M.samples(runs, stats))):
        if family.type == "counter":
            for s in family.samples:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _old_rule(stats: Iterable[Mapping]) -> Series:
    """The counters as the rule before made them: ``conflict_stats`` summed over every
    date."""
    out: Series = {}
    for r in stats:
        t = ("table", r["table"])
        if r["kind"] == "conflicts":
            name = "cdr_conflicts_total"
            resolver = r["resolver"] or M.NO_RESOLVER
            labels = tuple(
                sorted(
                    [
                        t,
                        ("type", r["conflict_type"]),
                        ("resolver", resolver),
                        ("outcome", r["outcome"]),
                    ]
                )
            )
        elif r["kind"] in ("events", "lost_writes"):
            name, labels = f"cdr_{r['kind']}_total", (t,)
        else:
            continue
        into = out.setdefault(name, {})
        into[labels] = into.get(labels, 0) + r["count"]
    return out


def increase(before: Series, after: Series) -> Series:
    """PromQL's ``increase()`` over a window holding the two scrapes (without its
    extrapolation): a sample lower than the one before is a counter reset, so the new
    value counts whole, from zero."""
    out: Series = {}
    for name, samples in after.items():
        for labels, v in samples.items():
            if (was := before.get(name, {}).get(labels)) is not None:
                out.setdefault(name, {})[labels] = v - was if v >= was else v
    return out


def _rerun_store() -> tuple[tuple[list[RunRow], list[dict]], tuple[list[RunRow], list[dict]]]:
    """The store before the rerun and after it (a failed run of the date between, which
    adds nothing): its own work is 30 conflicts, 380 events, 3 lost writes, and its stats
    replace its date's."""
    runs, stats, rerun = _store()
    last = NIGHTS[-1]
    failed = _run("failed", last, {APPLIED: 99}, 999, 99, status="failed")
    again = _run("n29-again", last, rerun, 380, 3)
    kept = [r for r in stats if r["dt"] != last]
    after = [*runs, failed, again], kept + _night_stats("n29-again", last, rerun, 380, 3)
    return (runs, stats), after


def _own() -> Series:
    """The rerun's own work, as the counters' series."""
    t = (("table", T),)

    def conflict(key: tuple[str, str, str]) -> tuple:
        ctype, resolver, outcome = key
        return tuple(sorted([*t, ("type", ctype), ("resolver", resolver), ("outcome", outcome)]))

    return {
        "cdr_conflicts_total": {conflict(APPLIED): 25, conflict(CONVERTED): 5},
        "cdr_events_total": {t: 380},
        "cdr_lost_writes_total": {t: 3},
    }


def test_a_rerun_adds_its_own_work_and_no_counter_goes_down():
    before, after = _rerun_store()
    first, second = _scrape(*before), _scrape(*after)
    for name, samples in first.items():
        for labels, v in samples.items():
            assert second[name][labels] >= v, (name, labels)
    assert increase(first, second) == _own()
    # the rule before: the rerun's fewer conflicts made every counter go down, a reset
    old_first, old_second = _old_rule(before[1]), _old_rule(after[1])
    assert all(
        old_second[name][labels] < v for name, s in old_first.items() for labels, v in s.items()
    )
    old = increase(old_first, old_second)
    assert old["cdr_events_total"] == {(("table", T),): 29 * 400 + 380}  # all again


def test_a_store_of_the_release_before_keeps_its_totals_at_the_upgrade():
    """Runs rows without their conflicts: their ``conflict_stats`` rows count for them,
    so the totals are the old rule's."""
    runs, stats, _ = _store()
    assert _scrape([_legacy(r) for r in runs], stats) == _old_rule(stats) == _scrape(runs, stats)


def _legacy(r: RunRow) -> RunRow:
    """``r`` as a release before the counters' keys wrote it."""
    return RunRow(**{**r.__dict__, "counts": {"tables": r.counts["tables"]}})


def test_a_store_of_the_release_before_keeps_its_totals_across_a_rerun():
    """After the upgrade, a rerun of a date an earlier release published: the conflicts of
    that run it replaces in ``conflict_stats`` go in its ``runs`` row, and count for it."""
    (runs, stats), (after_runs, after_stats) = _rerun_store()
    runs = [_legacy(r) for r in runs]
    rerun = after_runs[-1]
    gone = [
        [r["run_id"], r["table"], r["conflict_type"], r["resolver"], r["outcome"], r["count"]]
        for r in stats
        if r["dt"] == NIGHTS[-1] and r["kind"] == "conflicts"
    ]
    assert gone  # the rows of n29 the rerun replaced
    noted = RunRow(**{**rerun.__dict__, "counts": {**rerun.counts, "replaced_conflicts": gone}})
    first = _scrape(runs, stats)
    second = _scrape([*runs, *after_runs[len(runs) : -1], noted], after_stats)
    assert increase(first, second) == _own()
    # without them the rerun would have taken n29's conflicts out: a reset
    dropped = _scrape([*runs, rerun], after_stats)
    assert any(
        dropped["cdr_conflicts_total"][labels] < v
        for labels, v in first["cdr_conflicts_total"].items()
    )


ALERT = re.compile(r"sum by \((\w+)\) \(increase\((\w+)\[(\w+)\]\)\) > (\d+)")


def _alerts() -> list[tuple[str, str, float]]:
    """The counter alerts of docs/operations.md#metrics: (label, metric, threshold)."""
    page = (REPO / "docs" / "operations.md").read_text()
    block = page.split("<!-- metrics-alerts:begin -->")[1].split("<!-- metrics-alerts:end -->")[0]
    lines = [ln for ln in block.splitlines() if ln and not ln.startswith("```")]
    found = [ALERT.fullmatch(ln) for ln in lines]
    assert all(found), f"an alert the test cannot evaluate: {lines}"
    return [(m[1], m[2], float(m[4])) for m in found if m]


def _firing(before: Series, after: Series) -> list[tuple[str, str]]:
    """(metric, label value) of every documented alert that fires over the two scrapes."""
    grown = increase(before, after)
    out = []
    for by, metric, threshold in _alerts():
        sums: dict[str, float] = {}
        for labels, v in grown.get(metric, {}).items():
            key = dict(labels)[by]
            sums[key] = sums.get(key, 0) + v
        out += [(metric, k) for k, v in sums.items() if v > threshold]
    return out


def test_the_documented_alerts_do_not_fire_on_a_rerun():
    alerts = _alerts()
    assert {m for _, m, _ in alerts} == {"cdr_conflicts_total", "cdr_lost_writes_total"}
    before, after = _rerun_store()
    assert _firing(_scrape(*before), _scrape(*after)) == []
    # the rule before: the reset counted every night again, and both fired
    assert sorted(_firing(_old_rule(before[1]), _old_rule(after[1]))) == [
        ("cdr_conflicts_total", T),
        ("cdr_lost_writes_total", T),
    ]
