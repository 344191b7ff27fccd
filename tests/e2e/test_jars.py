"""``cdr jars fetch`` with Maven: exactly the locked artifacts, each checked against its
sha256 (Maven's local repository, usually warm; CI gives make an empty one)."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.core.errors import JarsError
from pipeline.spark import jars


def _small() -> list[jars.Jar]:
    return [j for j in jars.locked() if j.artifact in ("delta-storage", "reactive-streams")]


def test_fetch_puts_the_locked_jars_in_the_folder(tmp_path):
    lock = _small()
    assert jars.fetch(tmp_path, lock) == tmp_path
    assert sorted(p.name for p in tmp_path.glob("*.jar")) == sorted(j.file_name for j in lock)
    assert all(jars.sha256(tmp_path / j.file_name) == j.sha256 for j in lock)
    assert jars.checked(tmp_path, lock)


def test_a_jar_whose_sha256_differs_is_refused_and_not_kept(tmp_path):
    lock = _small()
    lock[0] = dataclasses.replace(lock[0], sha256="0" * 64)
    with pytest.raises(JarsError, match=f"{lock[0].coordinate}: its sha256"):
        jars.fetch(tmp_path, lock)
    assert not (tmp_path / lock[0].file_name).exists()
    assert not jars.checked(tmp_path, lock)


def test_an_artifact_maven_cannot_find_fails_with_mavens_words(tmp_path):
    lock = [jars.Jar("io.delta", "delta-spark_4.2_2.13", "0.0.404", "0" * 64)]
    with pytest.raises(JarsError, match="Maven could not fetch the jars"):
        jars.fetch(tmp_path, lock)
