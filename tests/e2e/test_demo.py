"""``cdr demo`` tells the truth (issue 50, item 4): on its production-like workload (mostly
updates of recent rows, about 2% contended keys, one replica's clock 20 s behind) both
nights pass every suite, and the output leads with resolved conflicts, each with both
versions and the rule that decided, then says where to look."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from pipeline.core.instants import micros_to_iso


def test_the_demo_passes_its_suites_and_shows_what_it_resolved(tmp_path: Path):
    cdr = Path(sys.executable).with_name("cdr")
    env = {**os.environ, "CDR_SHUFFLE_PARTITIONS": "2"}
    p = subprocess.run(
        [str(cdr), "demo", "--dir", str(tmp_path / "demo"), "--events", "4000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    out = p.stdout
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    nights = re.findall(
        r"^night (\S+): .* (\d+) writes lost in (\d+) concurrent conflicts "
        r"\((\d+) conflicts resolved by the origin rule\), (.*)$",
        out,
        re.M,
    )
    assert len(nights) == 2, out
    assert all(re.fullmatch(r"\d+ suites passed", verdict) for *_, verdict in nights), nights
    assert "failed" not in out.lower(), out
    # it leads with what was resolved: the examples come before the report and the paths
    resolved = out.index("What was resolved on")
    assert resolved < out.index("validation:") < out.index("Where to look")
    examples = re.findall(r"^  (\w+) (\{.*\}): (\w+), (\w+) -> (\w+)$", out, re.M)
    assert examples and len({e[2] for e in examples}) == len(examples), out
    lines = {
        w: len(re.findall(rf"^    {w} ", out, re.M)) for w in ("here", "remote", "why", "seen")
    }
    # the writes lost lead: the first example is a concurrent conflict (docs/rules.md#lost-writes)
    assert re.search(r"^    seen   (\S+)", out, re.M)[1] == "concurrent:", out
    assert all(int(lost) <= int(conc) <= int(total) for _, lost, conc, total, _ in nights)
    assert lines == dict.fromkeys(lines, len(examples)), lines
    # each time it prints: the instant, the µs the rules compared beside it
    remotes = re.findall(r"^    remote \S+ at (\S+) \((\d+)\): ", out, re.M)
    assert len(remotes) == len(examples), out
    assert all(micros_to_iso(int(us)) == at for at, us in remotes), remotes
    page = re.search(r"the Conflicts page: (\S+)", out)
    assert page and "<svg" in Path(page[1]).read_text()
    # the summary it offers, from the store's copy (docs/operations.md#cdr-report)
    command = re.search(r"a summary to paste: cdr (report .*)$", out, re.M)
    assert command, out
    said = subprocess.run(
        [str(cdr), *command[1].split()], capture_output=True, text=True, env=env, timeout=120
    )
    assert said.returncode == 0, said.stderr[-3000:]
    assert said.stdout.startswith("# Run of 2026-11-21: published\n"), said.stdout
    assert re.search(r"^\*\*[\d,]+ conflicts on [\d,]+ keys\*\*", said.stdout, re.M)
    assert said.stdout.index("## Writes lost") < said.stdout.index("## Conflicts")
