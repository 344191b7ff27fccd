"""The commands that set up a place to try ``cdr`` and the JVM it runs: ``cdr init`` (a
first config from a database's schema), ``generate`` (synthetic exports), ``demo``,
``jars`` and ``jvm-archive``.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from pipeline.app.cli_args import config_of, emit
from pipeline.core.errors import ConfigError


def _clock_offsets(given: list[str], replicas: tuple[str, ...]) -> dict[str, int]:
    """``--clock-offset REPLICA=SECONDS``, each naming a configured replica."""
    out = {}
    for text in given:
        name, _, seconds = text.partition("=")
        if name not in replicas or not re.fullmatch(r"[+-]?\d+", seconds.strip()):
            raise ConfigError(
                "--clock-offset",
                [f"{text!r} is not REPLICA=SECONDS with one of: {', '.join(replicas)}"],
            )
        out[name] = int(seconds)
    return out


def cmd_generate(args: argparse.Namespace) -> int:
    """Seeded synthetic exports of one date, written to the config's store."""
    from pipeline.app.generate import GenerateOptions, generate  # deferred: cdr --help stays fast
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

    config = config_of(args)
    assert config.store
    given = {"conflict_rate": args.conflict_rate, "skew": args.skew}  # unset: the defaults
    opts = GenerateOptions(
        **{k: v for k, v in given.items() if v is not None},
        events=args.events,
        late_rate=args.late_rate,
        delete_rate=args.delete_rate,
        update_share=args.update_share,
        full_rows=args.full_rows,
        base_rows=args.base_rows,
        fmt=args.format,
        files=args.files,
        seed=args.seed,
        clock_offsets=_clock_offsets(args.clock_offset, config.replica_ids),
    )
    stats = generate(config, open_store(config.store), args.date, opts)
    emit(
        args, stats, f"generated {stats['records']} event records for {args.date} in {config.store}"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """An embedded S3 server, generated exports and a full run (``--serve``: kept up)."""
    from pipeline.app.demo import demo  # deferred: cdr --help stays fast

    return demo(args.dir.resolve(), events=args.events, seed=args.seed, serve=args.serve)


def cmd_jars(args: argparse.Namespace) -> int:
    """``fetch`` the locked JVM packages, or print their class path (``path``, ``list``)."""
    from pipeline.spark import jars  # deferred: cdr --help stays fast

    if args.action == "fetch":
        print(f"jars: {len(jars.locked())} checked against {jars.LOCK_NAME} in {jars.fetch()}")
        return 0
    sep = os.pathsep if args.action == "path" else ","
    print(sep.join(str(p) for p in jars.classpath()))
    return 0


def cmd_jvm_archive(args: argparse.Namespace) -> int:
    """Build the class-data archive that starts Spark's JVM faster."""
    from pipeline.app.jvm_archive import build  # deferred: cdr --help stays fast

    print(f"class-data archive: {build()}")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    """A first ``cdr.yaml`` from a PostgreSQL schema
    (docs/configuration.md#starting-from-a-postgresql-schema-cdr-init); an existing file is
    kept unless ``--force``."""
    from pipeline.app.init_config import InitOptions, render  # deferred: cdr --help stays fast
    from pipeline.app.pg_schema import read_schema  # deferred: psycopg, for this command only

    out: Path = args.out
    if out.exists() and not args.force:
        raise ConfigError("--out", [f"{out} exists: name another file, or --force to replace it"])
    tables = tuple(t.strip() for given in args.tables for t in given.split(",") if t.strip())
    replicas = tuple(r.strip() for r in (args.replicas or "").split(",") if r.strip())
    schema = read_schema(args.from_postgres, args.schema, tables)
    text = render(schema, InitOptions(replicas, args.store, args.skip_unsupported))
    _check_written(text, str(out))
    with out.open("w" if args.force else "x") as f:
        f.write(text)
    names = [t.name for t in schema.tables]
    emit(
        args,
        {"out": str(out), "tables": names, "schema": schema.schema},
        f"wrote {out}: {len(names)} table(s) of schema {schema.schema} ({', '.join(names)}); "
        "read its comments, then name the replicas and the store",
    )
    return 0


def _check_written(text: str, source: str) -> None:
    """The file ``cdr init`` writes loads as it is (its store aside): a mistake of the
    writer is not left for the first run to find."""
    import yaml  # deferred: cdr --help stays fast

    from pipeline.core.config_load import parse_config  # deferred: cdr --help stays fast

    parse_config(yaml.safe_load(text), source)
