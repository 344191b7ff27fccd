"""The store: one URI holding inputs and outputs (docs/outputs.md).

``s3://BUCKET/PREFIX`` goes through boto3 (endpoint, region and credentials from the usual
boto3 sources: ``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``, profiles); ``file:///PATH``
is a local folder. Keys are always relative to the store's root and use ``/``.
These methods move the small objects (manifests, the runs table's and the lease's control
files, reports) and, in Spark tasks, the export files of the fetch. The bulk of the bytes
(the Delta tables, an ``s3://`` work folder) go through Spark's own Hadoop filesystem:
:func:`s3a_uri` names an ``s3://`` URI as Hadoop reads it, and
``pipeline.spark.session.use_s3a`` configures the bucket's ``s3a://`` access.
"""

from __future__ import annotations

import fcntl
import hashlib
import mimetypes
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from pipeline.core.errors import NotFoundError, StoreError

#: names (a class body's ``list`` is its method: this is the builtin's)
Names = list[str]


class Store(Protocol):
    uri: str

    def exists(self, key: str) -> bool: ...
    def read_bytes(self, key: str) -> bytes: ...
    def write_bytes(self, key: str, data: bytes) -> None: ...
    def create(self, key: str, data: bytes) -> bool: ...
    def read_token(self, key: str) -> tuple[bytes, str] | None: ...
    def replace_if(self, key: str, data: bytes, token: str) -> bool: ...
    def delete_if(self, key: str, token: str) -> bool: ...
    def read_tail(self, key: str, n: int) -> tuple[int, bytes]: ...
    def list(self, prefix: str) -> list[str]: ...
    def folders(self, prefix: str) -> Names: ...
    def any_under(self, prefix: str) -> bool: ...
    def sizes(self, prefix: str) -> dict[str, int]: ...
    def download(self, key: str, dest: Path) -> None: ...
    def upload(self, src: Path, key: str) -> None: ...
    def copy(self, src_key: str, key: str) -> None: ...
    def delete(self, keys: Sequence[str]) -> None: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def local_path(self, key: str) -> Path | None: ...


def _files_under(root: Path) -> Iterator[Path]:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            yield Path(dirpath) / f


class FileStore:
    """A local folder; writes go through a temporary name and a rename."""

    def __init__(self, root: Path):
        self.root = root
        self.uri = root.as_uri()

    def _p(self, key: str) -> Path:
        return self.root / key

    def _object(self, key: str) -> Path:
        """The path of an object to read. A symbolic link on the way from the root is
        refused: an object of the store is in its folder, and a link inside an export
        would read what the export does not hold (like a path that escapes it)."""
        p = self.root
        for part in key.split("/"):
            p = p / part
            if p.is_symlink():
                raise StoreError(
                    f"{self.uri}/{p.relative_to(self.root).as_posix()} is a symbolic link: "
                    "refused, like a path that escapes the store's folder"
                )
        return p

    def local_path(self, key: str) -> Path | None:
        return self._p(key)

    def exists(self, key: str) -> bool:
        return self._p(key).exists()

    def read_bytes(self, key: str) -> bytes:
        try:
            return self._object(key).read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"{self.uri}/{key}: not found") from None

    def read_tail(self, key: str, n: int) -> tuple[int, bytes]:
        """The object's size and its last ``n`` bytes (all of it, if smaller)."""
        try:
            with self._object(key).open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - n))
                return size, f.read()
        except FileNotFoundError:
            raise NotFoundError(f"{self.uri}/{key}: not found") from None

    def write_bytes(self, key: str, data: bytes) -> None:
        p = self._p(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex}.tmp")  # writers never share it
        try:
            tmp.write_bytes(data)
            os.replace(tmp, p)
        finally:
            tmp.unlink(missing_ok=True)

    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if it does not exist (an exclusive create); False if it does."""
        p = self._p(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex}.tmp")
        try:
            tmp.write_bytes(data)
            os.link(tmp, p)  # atomic, and fails when the name is taken: the file is whole
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    # Compare-and-swap of one object (the lease): its token is the sha256 of its bytes,
    # and the swaps of a key take a lock of their own (``fcntl``), so that a replace or
    # delete decided on what it read is never applied to what another one wrote since.

    @contextmanager
    def _swapping(self, key: str) -> Iterator[None]:

        p = self._p(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p.with_name(f".{p.name}.swap"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def read_token(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and the token a conditional replace or delete of them
        names; None when there is no such object."""
        try:
            data = self._p(key).read_bytes()
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def replace_if(self, key: str, data: bytes, token: str) -> bool:
        """Replace the object only if it still holds what ``token`` names."""
        with self._swapping(key):
            now = self.read_token(key)
            if now is None or now[1] != token:
                return False
            self.write_bytes(key, data)
            return True

    def delete_if(self, key: str, token: str) -> bool:
        """Delete the object only if it still holds what ``token`` names."""
        with self._swapping(key):
            now = self.read_token(key)
            if now is None or now[1] != token:
                return False
            self._p(key).unlink()
            return True

    def list(self, prefix: str) -> list[str]:
        base = self._p(prefix)
        if not base.is_dir():
            return []
        return sorted(str(f.relative_to(self.root).as_posix()) for f in _files_under(base))

    def folders(self, prefix: str) -> Names:
        """The names of the folders right under ``prefix`` (none: no such folder)."""
        base = self._p(prefix)
        return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []

    def sizes(self, prefix: str) -> dict[str, int]:
        """The keys under ``prefix`` with their sizes in bytes."""
        return {k: self._p(k).stat().st_size for k in self.list(prefix)}

    def any_under(self, prefix: str) -> bool:
        """Whether any object is under ``prefix`` (a read: a missing root is none)."""
        base = self._p(prefix)
        return base.is_dir() and next(_files_under(base), None) is not None

    def download(self, key: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(self._object(key), dest)
        except FileNotFoundError:
            raise NotFoundError(f"{self.uri}/{key}: not found") from None

    def upload(self, src: Path, key: str) -> None:
        p = self._p(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex}.tmp")
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, p)
        finally:
            tmp.unlink(missing_ok=True)

    def copy(self, src_key: str, key: str) -> None:
        """An object of the store copied to another key of it: a hard link (no bytes
        copied; the two names stay whole when one is removed), or a copy across file
        systems."""
        src, p = self._p(src_key), self._p(key)
        if not src.exists():
            raise NotFoundError(f"{self.uri}/{src_key}: not found")
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex}.tmp")
        try:
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copyfile(src, tmp)
            os.replace(tmp, p)
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, keys: Sequence[str]) -> None:
        """Delete these objects (a missing one is no error)."""
        for key in keys:
            self._p(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> None:
        p = self._p(prefix)
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


#: the answers of S3 to a conditional create that lost: the key exists (412), or another
#: conditional write of it is in flight (409)
LOST_RACE = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")


class S3Store:
    """A bucket and prefix reached through boto3."""

    def __init__(self, bucket: str, prefix: str, client: Any = None):
        import boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.client = client or boto3.client("s3")

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def local_path(self, key: str) -> Path | None:
        return None

    def _fail(self, key: str, e: Exception) -> StoreError:
        return StoreError(f"s3://{self.bucket}/{self._k(key)}: {e}")

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._k(key))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._fail(key, e) from None

    def read_bytes(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._k(key))
            return bytes(obj["Body"].read())
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if code in ("404", "NoSuchKey"):
                raise NotFoundError(f"s3://{self.bucket}/{self._k(key)}: not found") from None
            raise self._fail(key, e) from None

    def write_bytes(self, key: str, data: bytes) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data)
        except ClientError as e:
            raise self._fail(key, e) from None

    def create(self, key: str, data: bytes) -> bool:
        """A conditional put (``If-None-Match: *``): False when the key exists (412), or
        when another conditional write of it was in flight (409): a lost race either way."""
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data, IfNoneMatch="*")
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in LOST_RACE:
                return False
            raise self._fail(key, e) from None

    def read_token(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and its ETag (what ``If-Match`` names); None when absent."""
        from botocore.exceptions import ClientError

        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._k(key))
            return bytes(obj["Body"].read()), str(obj["ETag"])
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise self._fail(key, e) from None

    def replace_if(self, key: str, data: bytes, token: str) -> bool:
        """A conditional put (``If-Match``): False when the object changed or is gone."""
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data, IfMatch=token)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in (*LOST_RACE, "404", "NoSuchKey"):
                return False
            raise self._fail(key, e) from None

    def delete_if(self, key: str, token: str) -> bool:
        """A conditional delete (``If-Match``): False when the object changed or is gone."""
        from botocore.exceptions import ClientError

        if not self.exists(key):
            return False
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._k(key), IfMatch=token)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in (*LOST_RACE, "404", "NoSuchKey"):
                return False
            raise self._fail(key, e) from None

    def read_tail(self, key: str, n: int) -> tuple[int, bytes]:
        """The object's size and its last ``n`` bytes (all of it, if smaller): one GET."""
        from botocore.exceptions import ClientError

        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self._k(key), Range=f"bytes=-{n}")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                raise NotFoundError(f"s3://{self.bucket}/{self._k(key)}: not found") from None
            raise self._fail(key, e) from None
        data = r["Body"].read()
        total = str(r.get("ContentRange", "")).rsplit("/", 1)[-1]
        return (int(total) if total.isdigit() else len(data)), data

    def list(self, prefix: str) -> list[str]:
        return sorted(self.sizes(prefix))

    def folders(self, prefix: str) -> Names:
        """The names of the folders right under ``prefix`` (S3's common prefixes: one
        listing of the level, not of every key below it)."""
        from botocore.exceptions import ClientError

        base = self._k(prefix).rstrip("/") + "/"
        out: Names = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base, Delimiter="/"
            )
            for page in pages:
                out += [
                    p["Prefix"][len(base) :].rstrip("/") for p in page.get("CommonPrefixes", [])
                ]
        except ClientError as e:
            raise self._fail(prefix, e) from None
        return sorted(out)

    def any_under(self, prefix: str) -> bool:
        """Whether any object is under ``prefix/``: one listing call of one key."""
        from botocore.exceptions import ClientError

        try:
            r = self.client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._k(prefix).rstrip("/") + "/", MaxKeys=1
            )
        except ClientError as e:
            raise self._fail(prefix, e) from None
        return bool(r.get("Contents"))

    def sizes(self, prefix: str) -> dict[str, int]:
        """The keys under ``prefix/`` with their sizes in bytes (one listing)."""
        from botocore.exceptions import ClientError

        out: dict[str, int] = {}
        cut = len(self.prefix) + 1 if self.prefix else 0
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._k(prefix).rstrip("/") + "/"
            )
            for page in pages:
                for o in page.get("Contents", []):
                    out[o["Key"][cut:]] = int(o["Size"])
        except ClientError as e:
            raise self._fail(prefix, e) from None
        return out

    def download(self, key: str, dest: Path) -> None:
        from botocore.exceptions import ClientError

        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.client.download_file(self.bucket, self._k(key), str(dest))
        except ClientError as e:
            raise self._fail(key, e) from None

    def upload(self, src: Path, key: str) -> None:
        from boto3.exceptions import S3UploadFailedError

        # a content type, so that a browser opens the Data Docs' pages from S3
        content_type = mimetypes.guess_type(src.name)[0] or "application/octet-stream"
        try:
            self.client.upload_file(
                str(src), self.bucket, self._k(key), ExtraArgs={"ContentType": content_type}
            )
        except S3UploadFailedError as e:
            raise self._fail(key, e) from None

    def copy(self, src_key: str, key: str) -> None:
        """An object of the bucket copied to another key of it, by S3 itself (the bytes go
        through no client)."""
        from botocore.exceptions import ClientError

        source = {"Bucket": self.bucket, "Key": self._k(src_key)}
        try:
            self.client.copy(source, self.bucket, self._k(key))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise NotFoundError(f"s3://{self.bucket}/{self._k(src_key)}: not found") from None
            raise self._fail(key, e) from None

    def delete(self, keys: Sequence[str]) -> None:
        """Delete these objects, a thousand per request (a missing one is no error)."""
        for i in range(0, len(keys), 1000):
            batch = [{"Key": self._k(k)} for k in keys[i : i + 1000]]
            resp = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})
            for err in resp.get("Errors", [])[:1]:  # a partial failure is still a failure
                raise StoreError(f"s3://{self.bucket}/{err['Key']}: {err.get('Message', err)}")

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under ``prefix/``."""
        self.delete(self.list(prefix))


def s3a_uri(uri: str) -> str:
    """An ``s3://`` URI as Spark's Hadoop reads it (``s3a://``)."""
    return "s3a://" + uri.removeprefix("s3://")


def open_store(uri: str) -> Store:
    """``s3://BUCKET[/PREFIX]`` or ``file:///PATH``; anything else is a StoreError."""
    u = urlparse(uri)
    if u.scheme == "s3":
        if not u.netloc:
            raise StoreError(f"{uri}: no bucket")
        return S3Store(u.netloc, u.path)
    if u.scheme == "file":
        if u.netloc not in ("", "localhost"):
            raise StoreError(f"{uri}: file URIs name a local path (file:///PATH)")
        return FileStore(Path(unquote(u.path)))
    raise StoreError(f"{uri}: a store is s3://BUCKET/PREFIX or file:///PATH")


def upload_tree(store: Store, src: Path, prefix: str) -> int:
    """Upload every file under ``src`` to ``prefix``; Spark's marker files are left out."""
    n = 0
    for f in sorted(_files_under(src)):
        name = f.name
        if name.startswith((".", "_")):  # .crc files, _SUCCESS
            continue
        store.upload(f, f"{prefix}/{f.relative_to(src).as_posix()}")
        n += 1
    return n


def replace_tree(store: Store, src: Path, prefix: str) -> None:
    """Make ``prefix`` hold what ``src`` holds (plain files: a run's validation results):
    upload every file, then delete what an earlier attempt left there."""
    before = set(store.list(prefix))
    written = set()
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        key = f"{prefix}/{f.relative_to(src).as_posix()}"
        store.upload(f, key)
        written.add(key)
    store.delete(sorted(before - written))
