"""What the gate says to do about a failure (docs/validation.md#what-a-failure-names): the
setting that would have let the night publish, its choices, and the command that runs the
date again. Pure: :mod:`pipeline.validate.stage` writes every failure through it.

A check whose severity follows a setting (``"${on_divergence}"``...) names that setting;
a check that fails whatever the config says (a key not unique, an event not accounted
for) names none: it is a broken export or a bug, and its sample says where."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.core.config import Config, Table
from pipeline.core.policy import ALLOWED, PRESETS, ConflictType, FkPolicy, Resolver
from pipeline.core.summary import Stopped
from pipeline.rules.decisions import DECIDABLE, Take

#: resolvers that stop a night, or need more than their name, left out of the choices
_NOT_A_CHOICE = frozenset({Resolver.ERROR, Resolver.APPLY_OR_ERROR, Resolver.PYTHON})


def rerun(dt: str, *flags: str) -> str:
    """The command that runs date ``dt`` again (``cdr run`` refuses a date with later
    published dates and names the one that runs them too)."""
    return "`" + " ".join(("cdr run --date", dt, *flags)) + "`"


def resolver_choices(table: Table, conflict: ConflictType) -> list[str]:
    """The resolvers a table may set for ``conflict`` instead of the one it has that stopped
    the night, sorted (docs/rules.md#resolvers)."""
    current = table.resolvers.get(conflict)
    return sorted(r.value for r in ALLOWED[conflict] - _NOT_A_CHOICE if r is not current)


def whose(table: Table, conflict: ConflictType) -> str:
    """Where the table's resolver of ``conflict`` comes from: its preset, or the config."""
    preset = PRESETS[table.preset].resolvers.get(conflict)
    if table.resolvers.get(conflict) is preset:
        return f"the {table.preset.value} preset's"
    return f"set by `tables.{table.name}.resolvers`"


def stopped(table: Table, st: Stopped, dt: str) -> str:
    """The failure of a table an ``error`` resolver stopped (docs/rules.md#fine-points):
    the conflict, the resolver and whose it is, and what to set before running again."""
    conflict = ConflictType(st.conflict_type)
    resolver = table.resolver_name(conflict)
    name = f"event {st.event_id}" + (f", conflict {st.conflict_id}" if st.conflict_id else "")
    choices = " | ".join(resolver_choices(table, conflict))
    return (
        f"table {table.name}: {conflict.value} on key {st.key} ({name}) met resolver "
        f"`{resolver}` ({whose(table, conflict)}): {st.reason}. Nothing is published for "
        f"{dt}. To resolve such conflicts, set `tables.{table.name}.resolvers: "
        f"{{{conflict.value}: {choices}}}` in the config (docs/rules.md#resolvers)"
        f"{_decide(conflict, st)}, then run the date again: {rerun(dt)}"
    )


def _decide(conflict: ConflictType, st: Stopped) -> str:
    """docs/rules.md#manual-decisions: the decision that answers this conflict alone, where
    a decision can (``decisions.DECIDABLE``)."""
    takes = DECIDABLE.get(conflict)
    if not st.conflict_id or not takes:
        return ""
    take = " | ".join(sorted(t.value for t in takes if t is not Take.ROW))
    return (
        f", or decide this one conflict: `cdr decide --conflict-id {st.conflict_id} "
        f"--take {take} --why '...'`"
    )


def _divergence(config: Config, dt: str) -> str:
    return (
        "`on_divergence: fail` withholds the night: set `on_divergence: warn` (the default) "
        f"to publish the converged state and report the keys, or run the date with "
        f"{rerun(dt, '--on-divergence warn')}; once it is published, "
        f"`cdr repair --date {dt} --replica R` brings a replica to it"
    )


def _orphans(config: Config, dt: str) -> str:
    if config.on_fk_violation is FkPolicy.QUARANTINE:  # it removed them: one is left
        return "`on_fk_violation: quarantine` left an orphan: report it as a bug"
    return (
        f"`on_fk_violation: {config.on_fk_violation.value}` withholds the night: set "
        "`on_fk_violation: quarantine` (the orphans go to quarantine, and back when their "
        "parent arrives: `retry: {fk_violation: N}`) or `warn` (published and reported), "
        f"then {rerun(dt)}"
    )


def _alert(config: Config, dt: str) -> str:
    return (
        "`alerts.conflict_rate.on: fail` withholds the night: once the rate is understood, "
        f"{rerun(dt, '--accept-alert')}, or set `on: warn`"
    )


def _share(config: Config, dt: str) -> str:
    share = config.quarantine_share.fail
    page = "docs/operations.md#a-loud-quarantine"
    return (
        f"`quarantine_share.fail: {share}` withholds the night ({page}): fix the export "
        f"and {rerun(dt)}, or raise `quarantine_share.fail`"
    )


#: (suite template, check) -> what a failure of it says to do, for the checks a setting
#: decides
_BY_CHECK: dict[tuple[str, str], Callable[[Config, str], str]] = {
    ("convergence", "no_divergent_perspective"): _divergence,
    ("convergence", "no_divergent_snapshot_export"): _divergence,
    ("foreign_keys", "no_orphan"): _orphans,
    ("alerts", "conflict_rate"): _alert,
    ("accounting", "quarantine_share"): _share,
}


def for_check(config: Config, suite: str, check: str, dt: str) -> str | None:
    """What a failed check of ``suite`` (``<template>.<table>``) says to do, or None for a
    check no setting decides."""
    advise = _BY_CHECK.get((suite.split(".", 1)[0], check))
    return None if advise is None else advise(config, dt)
