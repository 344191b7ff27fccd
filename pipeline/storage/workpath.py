"""The run's work location (docs/outputs.md): a local folder, or an S3
prefix that the driver and the executors reach each with their own credentials, so that
a cluster needs no folder shared by its nodes.

A :class:`WorkPath` is a file or folder of it, with the few operations of
:class:`pathlib.Path` the stages use (``/``, ``exists``, ``read_text``, ``glob``...).
``str()`` of it is where Spark reads and writes it (a local path, or ``s3a://``). It is
sent to a Spark task as its location only: the task opens the store again with the
executor's own credentials. Python tasks write their Parquet into a local folder
(:meth:`WorkPath.writing`) that is uploaded when they end; on a local work location they
write in place.
"""

from __future__ import annotations

import fnmatch
import io
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.errors import CdrError
from pipeline.spark.session import use_s3a
from pipeline.storage.store import Store, open_store, s3a_uri

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: the stores of this process, one per root (a Spark task opens its own)
_STORES: dict[str, Store] = {}


def _store(root: str) -> Store:
    if root not in _STORES:
        _STORES[root] = open_store(root)
    return _STORES[root]


@dataclass(frozen=True, order=True)
class WorkPath:
    """A file or folder of a work location: ``root``, a store URI (``file:///...`` or
    ``s3://bucket/prefix``), and ``key``, a path under it."""

    root: str
    key: str = ""

    @staticmethod
    def of(where: str | Path | WorkPath) -> WorkPath:
        """A work location from a local path, a ``file://`` or an ``s3://`` URI."""
        if isinstance(where, WorkPath):
            return where
        text = str(where)
        if "://" not in text:
            return WorkPath(Path(text).resolve().as_uri())
        if urlparse(text).scheme not in ("file", "s3"):
            raise CdrError(f"{text}: a work location is a local folder or s3://BUCKET/PREFIX")
        return WorkPath(text.rstrip("/"))

    @property
    def store(self) -> Store:
        return _store(self.root)

    @property
    def local(self) -> Path | None:
        """The path on this machine, for a local work location."""
        return self.store.local_path(self.key) if self.root.startswith("file:") else None

    def __truediv__(self, part: str) -> WorkPath:
        return WorkPath(self.root, f"{self.key}/{part}".strip("/"))

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> WorkPath:
        return WorkPath(self.root, self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def __str__(self) -> str:
        """Where Spark finds it: a local path, or ``s3a://bucket/prefix/key``."""
        if (local := self.local) is not None:
            return str(local)
        return s3a_uri(f"{self.root}/{self.key}".rstrip("/"))

    def as_uri(self) -> str:
        if (local := self.local) is not None:
            return local.as_uri()
        return f"{self.root}/{self.key}".rstrip("/")

    def exists(self) -> bool:
        if (local := self.local) is not None:
            return local.exists()
        return self.store.exists(self.key) or bool(self.store.list(self.key))

    def is_file(self) -> bool:
        if (local := self.local) is not None:
            return local.is_file()
        return self.store.exists(self.key)

    def is_dir(self) -> bool:
        if (local := self.local) is not None:
            return local.is_dir()
        return bool(self.store.list(self.key))

    def read_bytes(self) -> bytes:
        return self.store.read_bytes(self.key)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        self.store.write_bytes(self.key, data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """A folder on a local work location; nothing on S3 (keys need no folders)."""
        if (local := self.local) is not None:
            local.mkdir(parents=parents, exist_ok=exist_ok)

    def glob(self, pattern: str) -> list[WorkPath]:
        """The files (and, locally, folders) matching ``pattern``, each ``/``-separated
        part of it matched against one part of the path, as ``Path.glob`` does."""
        if (local := self.local) is not None:
            return sorted(self / p.relative_to(local).as_posix() for p in local.glob(pattern))
        parts = pattern.split("/")
        cut = len(self.key) + 1 if self.key else 0
        found = set()
        for k in self.store.list(self.key):
            rel = k[cut:].split("/")
            if len(rel) >= len(parts) and all(
                fnmatch.fnmatchcase(r, p) for r, p in zip(rel, parts, strict=False)
            ):
                found.add(self / "/".join(rel[: len(parts)]))
        return sorted(found)

    def unlink(self) -> None:
        self.store.delete([self.key])

    def move_to(self, dest: WorkPath) -> None:
        """This file or folder under another name of the same location."""
        if (local := self.local) is not None and (there := dest.local) is not None:
            there.parent.mkdir(parents=True, exist_ok=True)
            local.rename(there)
            return
        keys = [self.key] if self.store.exists(self.key) else self.store.list(self.key)
        for k in keys:
            self.store.copy(k, dest.key + k[len(self.key) :])
        self.store.delete(keys)

    def rmtree(self) -> None:
        """Remove the folder and everything under it (nothing if it is not there)."""
        self.store.delete_prefix(self.key)

    def parquet_files(self) -> list[WorkPath]:
        """The data files in this folder, without Spark's markers."""
        return [p for p in self.glob("*.parquet") if not p.name.startswith((".", "_"))]

    @contextmanager
    def writing(self) -> Iterator[Path]:
        """A local folder to write this folder's files into: the folder itself on a local
        work location; else a temporary one, uploaded here when the block ends well."""
        if (local := self.local) is not None:
            local.mkdir(parents=True, exist_ok=True)
            yield local
            return
        with tempfile.TemporaryDirectory(prefix="cdr-work-") as tmp:
            yield Path(tmp)
            for f in sorted(p for p in Path(tmp).rglob("*") if p.is_file()):
                self.store.upload(f, f"{self.key}/{f.relative_to(tmp).as_posix()}")

    @contextmanager
    def fetched(self) -> Iterator[Path]:
        """This folder as a local one to read: itself, or a temporary copy."""
        if (local := self.local) is not None:
            yield local
            return
        with tempfile.TemporaryDirectory(prefix="cdr-work-") as tmp:
            cut = len(self.key) + 1
            for k in self.store.list(self.key):
                self.store.download(k, Path(tmp) / k[cut:])
            yield Path(tmp)

    def attach(self, spark: SparkSession) -> None:
        """Point the session's s3a at this location's bucket (nothing for a local one)."""
        if self.local is None:
            use_s3a(spark, urlparse(self.root).netloc)


def read_table(p: WorkPath, columns: list[str] | None = None) -> pa.Table:
    if (local := p.local) is not None:
        return pq.read_table(local, columns=columns)
    return pq.read_table(pa.BufferReader(p.read_bytes()), columns=columns)


def read_folder(folder: WorkPath, columns: list[str] | None = None) -> pa.Table | None:
    """The rows of every Parquet file of a folder; None if it has none."""
    files = folder.parquet_files()
    if not files:
        return None
    return pa.concat_tables([read_table(f, columns) for f in files])


def read_columns(folder: WorkPath, columns: list[str]) -> pa.Table:
    """Columns of every Parquet file of a folder; no rows (as text) when it has none."""
    got = read_folder(folder, columns)
    return pa.table({c: pa.array([], pa.string()) for c in columns}) if got is None else got


def write_table(table: pa.Table, p: WorkPath, **options: Any) -> None:
    """One Parquet file, written whole: locally under a temporary name then renamed, on S3
    by one PUT (a reader never sees half a file; a retried task replaces it)."""
    if (local := p.local) is not None:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex}.tmp")
        try:
            pq.write_table(table, tmp, **options)
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)
        return
    buf = io.BytesIO()
    pq.write_table(table, buf, **options)
    p.write_bytes(buf.getvalue())


def metadata(p: WorkPath) -> pq.FileMetaData:
    """A Parquet file's footer; on S3 one ranged read of its end (two if it is long)."""
    if (local := p.local) is not None:
        return pq.read_metadata(local)
    size, tail = p.store.read_tail(p.key, 64 * 1024)
    need = int.from_bytes(tail[-8:-4], "little") + 8
    if need > len(tail) and need <= size:
        size, tail = p.store.read_tail(p.key, need)
    return pq.read_metadata(pa.PythonFile(_Tail(size, tail), mode="r"))


class _Tail(io.RawIOBase):
    """A file of ``size`` bytes of which only the end is known: what a Parquet reader
    needs to read the footer."""

    def __init__(self, size: int, tail: bytes):
        self.size, self.tail, self.pos = size, tail, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        start = self.pos - (self.size - len(self.tail))
        if start < 0:
            raise OSError("a Parquet footer reader read before the file's end it was given")
        end = len(self.tail) if n < 0 else start + n
        data = self.tail[start:end]
        self.pos += len(data)
        return data
