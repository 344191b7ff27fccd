"""The jars' lock: its format, the stamp that says a folder was checked, the error a
missing jar gives."""

from __future__ import annotations

import pytest

from pipeline.core.errors import JarsError
from pipeline.spark import jars
from tests.helpers import REPO


def test_the_lock_parses_and_names_delta_and_s3a():
    locked = jars.locked()
    names = {j.artifact for j in locked}
    assert {"delta-spark_4.2_2.13", "delta-storage", "hadoop-aws", "s3"} <= names
    assert all(len(j.sha256) == 64 for j in locked)
    # one artifact once, and never the SDK's 655 MB shaded bundle
    assert len(names) == len(locked) and "bundle" not in names


def test_the_package_reads_the_repository_lock():
    assert jars.lock_text() == (REPO / "jars.lock").read_text()


def test_a_malformed_line_names_its_number():
    with pytest.raises(JarsError, match="line 2"):
        jars.parse_lock("# head\nio.delta:delta-storage 00\n")


def _folder(tmp_path):
    lock = [jars.Jar("g", "a", "1", "0" * 64), jars.Jar("g", "b", "2", "1" * 64)]
    for j in lock:
        (tmp_path / j.file_name).write_bytes(b"jar")
    return lock


def test_a_folder_is_checked_only_with_its_stamp_and_sizes(tmp_path):
    lock = _folder(tmp_path)
    assert not jars.checked(tmp_path, lock)
    (tmp_path / jars.STAMP).write_text(jars._stamp(tmp_path, lock))
    assert jars.checked(tmp_path, lock)
    (tmp_path / "b-2.jar").write_bytes(b"a jar cut or replaced")
    assert not jars.checked(tmp_path, lock)
    (tmp_path / "b-2.jar").unlink()
    assert not jars.checked(tmp_path, lock)


def test_a_stamp_of_another_lock_does_not_count(tmp_path):
    lock = _folder(tmp_path)
    (tmp_path / jars.STAMP).write_text(jars._stamp(tmp_path, lock))
    assert not jars.checked(tmp_path, [lock[0], jars.Jar("g", "b", "2", "2" * 64)])


def test_missing_jars_say_how_to_fetch_them(tmp_path, monkeypatch):
    monkeypatch.setenv(jars.JARS_ENV, str(tmp_path))
    with pytest.raises(JarsError, match="cdr jars fetch"):
        jars.classpath()


def test_without_javac_the_log_store_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no javac on it
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JarsError, match=r"javac is needed.*default-jdk-headless"):
        jars.build_own(tmp_path)
    assert not list(tmp_path.glob("*.jar"))
