"""The validate stage: Great Expectations suites on what the run is about to publish, and
the policy gates (semantics.md §9, §10, §12).

Suites are version-controlled GX suite files in ``expectations/``. A suite is written
once for every table: ``${table}``, ``${key_columns}``... are filled in from the config,
and an expectation with ``meta.for_each`` is repeated per key column, NOT NULL column or
unique constraint (:func:`render_suite`). GX runs them on Spark DataFrames.

The gate fails the run when a suite fails, when an ``error`` resolver stopped a table,
when replicas diverge under ``on_divergence: fail``, or when orphans remain under
``on_fk_violation: fail``. The message names the check, the table and a few keys.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from pipeline.config import Config, DivergencePolicy, FkPolicy, Table
from pipeline.context import RunContext

log = logging.getLogger(__name__)

EXPECTATIONS_DIR = Path(
    os.environ.get("CDR_EXPECTATIONS_DIR", Path(__file__).resolve().parent.parent / "expectations")
)
SUITES = ("snapshot",)
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


@dataclass
class Verdict:
    """The run's gate: ``failures`` stop the publish; ``warnings`` are reported."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    suites: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures


def _fill(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: names.get(m.group(1), m.group(0)), value)
    if isinstance(value, dict):
        return {k: _fill(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, names) for v in value]
    return value


def _q(col: str) -> str:
    return f"`{col}`"


def render_suite(template: dict[str, Any], table: Table) -> dict[str, Any]:
    """The suite for one table (a plain GX suite dict, ready for ``ExpectationSuite``)."""
    base = {
        "table": table.name,
        "key_columns": ", ".join(_q(c) for c in table.key),
        "columns": ", ".join(_q(c) for c in table.column_names),
    }
    each: dict[str, list[dict[str, str]]] = {
        "key_column": [{"column": c} for c in table.key],
        "not_null_column": [{"column": c} for c in table.column_names if c in table.not_null],
        "unique_constraint": [
            {
                "constraint_columns": ", ".join(_q(c) for c in u),
                "constraint_not_null": " AND ".join(f"{_q(c)} IS NOT NULL" for c in u),
            }
            for u in table.unique
        ],
    }
    expectations = []
    for exp in template["expectations"]:
        loop = exp.get("meta", {}).get("for_each")
        for names in each[loop] if loop else [{}]:
            e = _fill({k: v for k, v in exp.items()}, base | names)
            e.setdefault("meta", {})["table"] = table.name
            expectations.append(e)
    return {
        "name": f"{template['name']}.{table.name}",
        "expectations": expectations,
        "meta": {"template": template["name"]},
    }


def load_template(name: str) -> dict[str, Any]:
    template: dict[str, Any] = json.loads((EXPECTATIONS_DIR / f"{name}.json").read_text())
    return template


def run_suite(df: DataFrame, suite: dict[str, Any]) -> dict[str, Any]:
    """Validate one DataFrame with GX; returns a JSON-safe summary of the results."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    name = suite["name"].replace(".", "_")
    # persist=False: GX would otherwise cache every validated DataFrame and never release it.
    ds = ctx.data_sources.add_spark(name=f"ds_{name}", persist=False)
    batch = ds.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe("all")
    gx_suite = ctx.suites.add(
        gx.ExpectationSuite(name=suite["name"], expectations=suite["expectations"])
    )
    vd = ctx.validation_definitions.add(
        gx.ValidationDefinition(name=f"vd_{name}", data=batch, suite=gx_suite)
    )
    result = vd.run(batch_parameters={"dataframe": df}, result_format="SUMMARY")
    checks = []
    for r in result.results:
        cfg = r.expectation_config
        assert cfg is not None  # every result of a suite run names its expectation
        res = r.result or {}
        sample = (
            res.get("details", {}).get("unexpected_rows")
            or res.get("partial_unexpected_list")
            or []
        )
        checks.append(
            {
                "expectation": cfg.type,
                "check": (cfg.meta or {}).get("check"),
                "kwargs": {k: v for k, v in cfg.kwargs.items() if k != "batch_id"},
                "success": bool(r.success),
                "observed": res.get("observed_value", res.get("unexpected_count")),
                "sample": json.loads(json.dumps(sample[:5], default=str)),
            }
        )
    return {"suite": suite["name"], "success": bool(result.success), "checks": checks}


def gate_from_summary(config: Config, summary: dict[str, Any], verdict: Verdict) -> None:
    """Failures and warnings that the resolve stage's counts already decide."""
    if summary.get("cdc", {}).get("warning"):
        verdict.warnings.append(summary["cdc"]["warning"])
    for t, s in summary["tables"].items():
        if s["stopped"]:
            st = s["stopped"]
            verdict.failures.append(
                f"table {t}: {st['conflict_type']} on key {st['key']} (event {st['event_id']}) "
                f"has resolver error: {st['reason']}"
            )
    if any(s["stopped"] for s in summary["tables"].values()):
        return  # §12: divergence and FK are not checked after an error
    divergence = (
        verdict.failures if config.on_divergence is DivergencePolicy.FAIL else verdict.warnings
    )
    for t, s in summary["tables"].items():
        where = f"(see published/{t}/divergence/dt={summary['dt']})"
        for replica, n in sorted(s["divergent_keys"].items()):
            divergence.append(
                f"table {t}: replica {replica} diverges from the converged state on {n} "
                f"key(s) {where}"
            )
        for replica, n in sorted(s.get("snapshot_divergent_keys", {}).items()):
            if n:
                divergence.append(
                    f"table {t}: the snapshot replica {replica} exported differs from the "
                    f"converged state on {n} key(s) {where}"
                )
        if s["orphans"]:
            msg = f"table {t}: {s['orphans']} orphan row(s) after resolution (foreign keys)"
            if config.on_fk_violation is FkPolicy.FAIL:
                verdict.failures.append(msg)
            else:
                verdict.warnings.append(msg + f" ({config.on_fk_violation.value})")


def validate_stage(
    spark: SparkSession, config: Config, ctx: RunContext, summary: dict[str, Any]
) -> Verdict:
    verdict = Verdict()
    gate_from_summary(config, summary, verdict)
    for suite_name in SUITES:
        template = load_template(suite_name)
        for t, table in config.tables.items():
            if summary["tables"][t]["stopped"]:
                continue
            snapshot = spark.read.parquet(str(ctx.resolved / t / "snapshot"))
            res = run_suite(snapshot, render_suite(template, table))
            verdict.suites[res["suite"]] = res
            for c in res["checks"]:
                if not c["success"]:
                    verdict.failures.append(
                        f"table {t}: expectation {c['expectation']} ({c['check']}) failed: "
                        f"observed {c['observed']}, e.g. {c['sample'][:3]}"
                    )
    ctx.validation.mkdir(parents=True, exist_ok=True)
    (ctx.validation / "results.json").write_text(
        json.dumps(
            {
                "passed": verdict.passed,
                "failures": verdict.failures,
                "warnings": verdict.warnings,
                "suites": verdict.suites,
            },
            indent=2,
            default=str,
        )
    )
    return verdict


def load_verdict(ctx: RunContext) -> Verdict:
    d = json.loads((ctx.validation / "results.json").read_text())
    return Verdict(d["failures"], d["warnings"], d["suites"])
