"""The commands about what to feed ``cdr``: ``cdr schema`` writes the JSON Schema of each
table's canonical event record, typed by its columns (docs/exports.md#cdr-schema)."""

from __future__ import annotations

import argparse

from pipeline.app.cli_args import config_of, emit


def cmd_schema(args: argparse.Namespace) -> int:
    """One table's schema to stdout, or every named table's to ``--out DIR/<table>.schema.json``."""
    from pipeline.ingest.schemas import dumps, table_schemas  # deferred: cdr --help stays fast

    args.store = "file:///"  # no store is read: a config without one will do
    schemas = table_schemas(config_of(args), args.table or None)
    if args.out is None and len(schemas) == 1:
        print(dumps(next(iter(schemas.values()))), end="")
        return 0
    out = args.out or args.config.parent / "schemas"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in schemas.items():
        path = out / f"{name}.schema.json"
        path.write_text(dumps(schema))
        written.append(str(path))
    emit(args, {"written": written}, "\n".join(f"wrote {p}" for p in written))
    return 0
