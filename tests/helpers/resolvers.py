"""Custom resolvers for the tests (docs/rules.md#custom-resolvers), importable by the
Spark workers of a test run (their working directory is the repository's)."""

from __future__ import annotations


def larger_n(local: dict, remote: dict, context: dict) -> str:
    """Symmetric: the version with the larger ``(n, v, ts, origin)`` wins."""

    def rank(x: dict) -> tuple:
        r = x["row"]
        return (r.get("n") or 0, r.get("v") or "", x["ts"], x["origin"] or "")

    return "remote" if rank(remote) > rank(local) else "local"


def always_remote(local: dict, remote: dict, context: dict) -> str:
    """Asymmetric: whichever side is remote wins."""
    return "remote"


def boom(local: dict, remote: dict, context: dict) -> str:
    raise RuntimeError(f"no rule for key {context['key']}")


def answers(value):
    """A resolver that answers ``value``, whatever the versions."""

    def resolve(local: dict, remote: dict, context: dict):
        return value

    return resolve


BAD_WORD = answers("both")
NO_SUCH_COLUMN = answers({"row": {"nope": 1}})
WRONG_TYPE = answers({"row": {"n": "seven"}})
NULL_NOT_NULL = answers({"row": {"v": None}})
#: a row that also tries to change the key, the delta column and the merge column
ROW = answers({"row": {"id": 99, "v": "mine", "n": 1000, "m": -5}})


def echo_local_row(local: dict, remote: dict, context: dict) -> dict:
    """Answers the local row as a row (so every value goes through the check)."""
    return {"row": dict(local["row"])}


UPPER_UUID = answers({"row": {"u": "0F8FAD5B-D9CB-469F-A165-70867728950E"}})
NOT_A_UUID = answers({"row": {"u": "0f8fad5b"}})


def crash(local: dict, remote: dict, context: dict) -> str:
    """Kills its Python worker, as running out of memory does."""
    import os

    os._exit(3)


#: a row whose unique value ``u`` no event writes (tests/spark/test_two_paths.py)
MERGED_ROW = answers({"row": {"u": "merged"}})
