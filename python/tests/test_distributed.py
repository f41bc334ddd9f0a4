"""A two-rank DDP run on CPU (gloo) under `pipeprof run -- torchrun`: each rank's processes
are recognised from the launcher's environment, kept apart (per-rank lines in the summary and
the report), and the rank whose loader was slowed on purpose (a sleep in its Dataset, inside
the workload) is named as the straggler, with the all-reduce wait measured in DDP's backward.
Real torch (scripts/test.sh installs it); the test never skips."""

import json
import subprocess
import sys

from conftest import HANG_S, REPO, pipeprof_bin, verdict_errors
from test_frameworks import env_for

DDP = REPO / "python" / "examples" / "train_ddp.py"
STEPS = 12


def test_two_rank_ddp_run_names_the_rank_with_the_slow_loader(tmp_path):
    summary = tmp_path / "d.json"
    # `python -m torch.distributed.run` is torchrun, with this interpreter whatever PATH says.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    # One DataLoader worker per rank: a rank's workers inherit its environment and are its own.
    cmd += [str(DDP), "--slow-rank", "1", "--steps", str(STEPS), "--workers", "1"]
    p = subprocess.run(
        [pipeprof_bin(), "run", "--once", "--no-gpu", "--summary", str(summary), "--trace", str(tmp_path / "t.json"), "--", *cmd],
        capture_output=True,
        text=True,
        env=env_for(tmp_path),
        timeout=HANG_S,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads(summary.read_text())

    # Both ranks, apart: each its own steps, all of them.
    lines = {r["rank"]: r for r in s.get("ranks", [])}
    assert sorted(lines) == [0, 1], s.get("ranks")
    for r, line in lines.items():
        assert line["world_size"] == 2 and line["local_rank"] == r, line
        assert line["steps"] == STEPS, line
        assert line["backward_ms"] is not None, "the torch hooks time DDP's backward on every rank"
    assert s["steps"] == 2 * STEPS, "the run counts every rank's steps"
    # The slowed rank waits for its data; the other does not.
    assert lines[1]["wait_share"] > lines[0]["wait_share"], lines
    names = list(s["threads"].values())
    assert any(n.startswith("rank 1 (pid ") for n in names), names
    loaders = sorted(t["name"].split(" (pid ")[0] for t in s["loader_threads"])
    assert loaders == ["loader-0 of rank 0", "loader-0 of rank 1"], s["loader_threads"]
    assert lines[1]["workers"] == 1 and lines[1]["loader_busy"] > lines[0]["loader_busy"], lines

    # The straggler: rank 1, for its input pipeline; rank 0 waits for it in the all-reduce.
    v = s["straggler"]
    assert (v["straggler"], v["cause"], v["synchronised"]) == (1, "Input", True), v
    assert v["sync"] == "Measured", v
    waits = dict(v["sync_wait_ms"])
    assert waits[0] > waits[1], waits
    assert v["evidence"][0].startswith("rank 1 waits for data"), v["evidence"]
    assert any("rank 1" in a for a in v["advice"]), v["advice"]

    # The report says the same, a line per rank.
    out = p.stdout
    assert "ranks: 2 of 2 reported" in out, out
    for r in (0, 1):
        assert f"  rank {r} · {STEPS} steps · " in out, out
    assert "straggler: rank 1\n" in out, out

    # `pipeprof report` on the summary reads the ranks back and judges them the same.
    again = subprocess.run([pipeprof_bin(), "report", str(summary)], capture_output=True, text=True, timeout=HANG_S)
    assert again.returncode == 0, again.stderr
    assert "straggler: rank 1\n" in again.stdout and f"  rank 0 · {STEPS} steps · " in again.stdout, again.stdout

    # A trace per rank, with its rank and clock, which `pipeprof report` reads back as ranks.
    traces = [tmp_path / f"t.rank{r}.json" for r in (0, 1)]
    for r, t in enumerate(traces):
        head = json.loads(t.read_text())
        info = head["distributedInfo"]
        assert {k: info[k] for k in ("rank", "local_rank", "world_size")} == {"rank": r, "local_rank": r, "world_size": 2}, t
        # The node the rank ran on: the run's (the host name here, no --node given).
        assert info["node"] == s["settings"]["node"]["name"] and info["node"], info
        assert isinstance(head["clockOffsetNs"], int)
    both = subprocess.run([pipeprof_bin(), "report", *map(str, traces)], capture_output=True, text=True, timeout=HANG_S)
    assert both.returncode == 0, both.stderr
    assert "pipeprof report: 2 ranks" in both.stdout and "straggler: rank 1\n" in both.stdout, both.stdout
    # `--json` on the ranks: the straggler as data, held against the schema.
    doc = subprocess.run([pipeprof_bin(), "report", *map(str, traces), "--json"], capture_output=True, text=True, timeout=HANG_S)
    assert doc.returncode == 0, doc.stderr
    doc = json.loads(doc.stdout)
    assert verdict_errors(doc) == [], verdict_errors(doc)
    assert (doc["straggler"]["rank"], doc["straggler"]["cause"]) == (1, "input"), doc["straggler"]
    assert doc["headline"] == doc["straggler"]["headline"] and doc["status"] == "ranks", doc
