"""A real two-node training job on this one machine: two network namespaces with their own host
names ("a" and "b", python/tests/netns.py), joined by a bridge, each running
`torchrun --nnodes 2 --nproc_per_node 2` (c10d rendezvous on node a, gloo over eth0) of
python/examples/train_ddp.py, node b's data behind a slow FUSE mount (python/tests/slowfs.py),
node a's on the local disk.

The first test is the harness's own proof: the plain job, without pipeprof, rendezvouses across
the namespaces and completes. The second wraps each node's torchrun in `pipeprof run`, with
metrics served to a real Prometheus in the root namespace (file-based discovery of both nodes,
`honor_labels`, docs/prometheus/rules.yml): it waits until Prometheus's recording rule
`pipeprof:job_straggler` names a rank of node b, stops both runs with Ctrl-C (SIGINT to their
process groups), and reads the summaries, the rank traces and `pipeprof report` over the shared
folder. Needs root, iproute2 and util-linux (the test fails without them: it never skips)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import slowfs
from conftest import HANG_S, REPO, pipeprof_bin, verdict_errors
from netns import TwoNodes
from test_frameworks import env_for

DDP = REPO / "python" / "examples" / "train_ddp.py"
PROM_DOCS = REPO / "docs" / "prometheus"
#: The c10d store's port on node a, and each node's metrics port: each node has its own ports.
RDZV_PORT = 29400
METRICS_PORT = 9464
#: Far more steps than the test waits for (≈ 200 ms each, paced by node b's storage):
#: the runs are stopped by Ctrl-C once Prometheus has named the straggler.
STEPS = 2000
#: Node b's data: each file's open costs this on its FUSE mount, 8 files a batch (≈ 200 ms a
#: batch per DataLoader worker, more than a step's compute here): its ranks wait for data.
OPEN_MS = 25
#: Steps every rank has made before the runs are stopped: the offline verdict judges each rank's
#: mean step, and the first few (start-up, the first all-reduce) are not the job's pace.
JUDGED_STEPS = 40


@pytest.fixture
def node_data(tmp_path_factory):
    """The job's data on each node: node a's on the local disk, node b's the same files behind
    the slow FUSE mount of python/tests/slowfs.py (a network file system's open and read times),
    unmounted after the test."""
    local = tmp_path_factory.mktemp("data")
    for k in range(32):
        (local / f"sample-{k}.bin").write_bytes(os.urandom(4096))
    mnt = tmp_path_factory.mktemp("fuse")
    with slowfs.mounted(str(local), str(mnt), open_ms=OPEN_MS, read_ms=1):
        yield {"a": local, "b": mnt}


@pytest.fixture
def nodes(node_data):
    # After node_data: torn down first, so no process of a node still reads the FUSE mount when
    # it goes.
    n = TwoNodes()
    try:
        yield n
    finally:
        n.close()


def torchrun(node_rank, master, job, steps, slow_rank=-1, data=None):
    # `python -m torch.distributed.run` is torchrun, with this interpreter whatever PATH says.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "2"]
    cmd += ["--node_rank", str(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master}:{RDZV_PORT}", "--rdzv-id", job]
    # One DataLoader worker per rank: a rank's workers inherit its environment and are its own.
    cmd += [str(DDP), "--steps", str(steps), "--workers", "1", "--slow-rank", str(slow_rank)]
    return cmd + (["--data", str(data)] if data else [])


def node_env(home):
    """A node's environment: a runtime folder of its own (outside the shared folder), and gloo
    on the node's eth0 (not the loopback its host name might resolve to)."""
    env = dict(env_for(home), GLOO_SOCKET_IFNAME="eth0")
    # The node's name and job are the test's (host names "a" and "b", torchrun's --rdzv-id), not a
    # Slurm allocation's the tests might run in.
    for k in [k for k in env if k.startswith("SLURM")] + ["TORCHELASTIC_RUN_ID", "GROUP_RANK"]:
        env.pop(k, None)
    return env


def tail(path, n=4000):
    """The end of a node's log, for a failure's message: of pipeprof's progress lines
    (`step N · …`), the last one only."""
    try:
        lines = path.read_text(errors="replace").replace("\r", "\n").splitlines()
    except OSError as e:
        return f"--- {path}: {e}"
    progress = [i for i, ln in enumerate(lines) if re.match(r"step \d+ · ", ln)]
    drop = set(progress[:-1])
    lines = [ln for i, ln in enumerate(lines) if i not in drop]
    return f"--- {path} (end) ---\n" + "\n".join(lines)[-n:]


def start_on_nodes(nodes, tmp_path_factory, cwd, command_for):
    """`command_for(k, node)` started on each node, its output in a log of the node's own:
    {name: (Popen, log path)}."""
    runs = {}
    for k, node in enumerate(nodes.nodes):
        home = tmp_path_factory.mktemp(f"node-{node.name}")
        log = home / "log"
        with open(log, "w") as out:
            p = nodes.popen(node, command_for(k, node), stdout=out, stderr=subprocess.STDOUT, env=node_env(home), cwd=cwd)
        runs[node.name] = (p, log)
    return runs


def wait_all(runs, what):
    """Each run's exit code, once it has ended; a run still going after HANG_S is stuck."""
    codes = {}
    for name, (p, log) in runs.items():
        try:
            codes[name] = p.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"node {name}'s {what} did not end within {HANG_S} s (hang guard)\n" + "\n".join(tail(lg) for _, lg in runs.values()))
    return codes


def test_plain_torchrun_job_spans_the_two_nodes(nodes, tmp_path, tmp_path_factory):
    """The harness's proof, without pipeprof: one job of 4 ranks over 2 nodes completes."""
    job = f"plain{os.getpid()}"
    master = nodes["a"].addr
    runs = start_on_nodes(nodes, tmp_path_factory, tmp_path, lambda k, _: torchrun(k, master, job, steps=4))
    codes = wait_all(runs, "torchrun")
    logs = {name: log.read_text(errors="replace") for name, (_, log) in runs.items()}
    assert codes == {"a": 0, "b": 0}, f"torchrun's exit codes: {codes}\n" + "\n".join(tail(lg) for _, lg in runs.values())
    # The c10d rendezvous ignores --node_rank: it numbers the nodes by their host names, sorted,
    # so node a's ranks are 0 and 1, node b's 2 and 3 (and --slow-rank 3 slows one of b's).
    assert "rank 0 done: loss " in logs["a"] and "rank 0 done" not in logs["b"], (
        "global rank 0 runs on node a\n" + "\n".join(tail(lg) for _, lg in runs.values())
    )


class Prometheus:
    """Debian's `prometheus` in the root namespace, on a private port and storage folder (as
    tests/metrics.rs runs it), with docs/prometheus/scrape.yml and rules.yml as they are but
    for the intervals (1 s, for a test), finding the nodes in a targets/*.json file."""

    def __init__(self, folder, job, targets):
        if shutil.which("prometheus") is None:
            pytest.fail("no `prometheus` on PATH: apt-get install prometheus (scripts/test.sh does)")
        for f in ("scrape.yml", "rules.yml"):
            assert (PROM_DOCS / f).exists(), f"{PROM_DOCS / f} missing: the test runs Prometheus with it"
        config = (PROM_DOCS / "scrape.yml").read_text()
        for key, value, at_least in (("scrape_interval", "1s", 1), ("scrape_timeout", "1s", 0), ("evaluation_interval", "1s", 1)):
            config, n = re.subn(rf"^(\s*{key}:\s*)\S+", rf"\g<1>{value}", config, flags=re.M)
            assert n >= at_least, f"docs/prometheus/scrape.yml sets no {key} for the test to shorten"
        # Its relative paths (rules.yml, targets/*.json) are read from the config's folder.
        (folder / "scrape.yml").write_text(config)
        shutil.copy(PROM_DOCS / "rules.yml", folder / "rules.yml")
        (folder / "targets").mkdir()
        (folder / "targets" / f"{job}.json").write_text(json.dumps([{"targets": targets}]))
        config = folder / "scrape.yml"
        self.lines = []
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}", "--web.listen-address=127.0.0.1:0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.api = None
        listening = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r'msg="Listening on" address=([^\s"]+)', line)
                if m and self.api is None:
                    self.api = m.group(1)
                    listening.set()
            listening.set()

        threading.Thread(target=read, daemon=True).start()
        if not listening.wait(HANG_S) or self.api is None:
            self.close()
            pytest.fail("prometheus did not say where it listens:\n" + "".join(self.lines[-30:]))

    def log(self):
        return "--- prometheus (end) ---\n" + "".join(self.lines[-30:])

    def try_query(self, q):
        """An instant query's result vector, or None while Prometheus is not ready (503)."""
        url = f"http://{self.api}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                v = json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 503:
                return None
            raise AssertionError(f"{q}: {e.code} {e.read()!r}") from e
        assert v["status"] == "success", f"{q}: {v}"
        return v["data"]["result"]

    def query(self, q):
        got = self.try_query(q)
        assert got is not None, f"{q}: prometheus is not ready"
        return got

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def prometheus_at(tmp_path_factory):
    started = []

    def start(job, targets):
        p = Prometheus(tmp_path_factory.mktemp("prometheus"), job, targets)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


def labels(sample_line):
    """The labels of one OpenMetrics sample line, as a dict."""
    inside = sample_line[sample_line.index("{") + 1 : sample_line.rindex("}")] if "{" in sample_line else ""
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', inside))


def test_two_nodes_prometheus_and_report_name_the_node_with_slow_storage(nodes, node_data, prometheus_at, tmp_path, tmp_path_factory):
    # Without the pipeprof package in the ranks' interpreter, `pipeprof run` sees no rank at all
    # (it samples the machine only), and Prometheus would never name one: say so at once.
    imp = subprocess.run([sys.executable, "-c", "import pipeprof"], capture_output=True, text=True, timeout=HANG_S)
    assert imp.returncode == 0, f"{sys.executable} cannot import pipeprof (scripts/test.sh installs the wheel):\n{imp.stderr}"
    shared = tmp_path
    job = f"ppjob{os.getpid()}"
    master = nodes["a"].addr
    prom = prometheus_at(job, [f"{n.addr}:{METRICS_PORT}" for n in nodes.nodes])

    def pipeprof_run(k, node):
        # `{node}` is the node's name: its host name, "a" or "b"; the job is torchrun's --rdzv-id.
        cmd = [pipeprof_bin(), "run", "--once", "--no-gpu", "--summary", f"{shared}/{{node}}.summary.json"]
        cmd += ["--trace", f"{shared}/{{node}}.trace.json", "--metrics-listen", f"0.0.0.0:{METRICS_PORT}", "--metrics-allow-remote"]
        return [*cmd, "--", *torchrun(k, master, job, STEPS, data=node_data[node.name])]

    runs = start_on_nodes(nodes, tmp_path_factory, shared, pipeprof_run)

    def logs():
        return "\n".join(tail(log) for _, log in runs.values()) + "\n" + prom.log()

    # Ask Prometheus until its recording rule names the straggler: a rank of node b, of this job
    # (and nothing else for this job). The pace of the asking is a wait on the runs' ending.
    guard = time.monotonic() + HANG_S
    named = None
    while True:
        for name, (p, _) in runs.items():
            assert p.poll() is None, f"node {name}'s pipeprof run ended (exit {p.returncode}) before Prometheus named the straggler\n" + logs()
        assert prom.proc.poll() is None, "prometheus ended\n" + logs()
        named = prom.try_query("pipeprof:job_straggler")
        ours = [s["metric"] for s in named or [] if s["metric"].get("job") == job]
        fewest = prom.try_query(f'min(pipeprof_steps_total{{job="{job}",rank!="all"}})')
        fewest = float(fewest[0]["value"][1]) if fewest else 0.0
        if [m.get("node") for m in ours] == ["b"] and ours[0].get("rank") in ("2", "3") and fewest >= JUDGED_STEPS:
            break
        assert time.monotonic() < guard, (
            f"hang guard ({HANG_S} s): Prometheus never named a rank of node b as this job's straggler; "
            f"pipeprof:job_straggler: {named}; up: {prom.try_query('up')}; pipeprof_straggler: {prom.try_query('pipeprof_straggler')}\n" + logs()
        )
        try:
            runs["a"][0].wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass

    # What Prometheus judged on, for the log (`pytest -s`): each rank's data wait and step, live.
    for q in ("pipeprof:rank_data_wait_seconds", "pipeprof:rank_step_seconds"):
        got = sorted((m["metric"].get("node"), m["metric"].get("rank"), float(m["value"][1])) for m in prom.try_query(q) or [])
        print(f"{q}: " + ", ".join(f"rank {r} on {n} {v * 1e3:.1f} ms" for n, r, v in got))

    # Each node's /metrics, from the root namespace: every series carries the job, the node and a
    # rank, and the ranks are the node's own (global ranks 0, 1 on a; 2, 3 on b).
    for k, node in enumerate(nodes.nodes):
        with urllib.request.urlopen(f"http://{node.addr}:{METRICS_PORT}/metrics", timeout=10) as r:
            text = r.read().decode()
        samples = [ln for ln in text.splitlines() if ln.startswith("pipeprof_")]
        assert samples, f"{node}: no pipeprof_ series on /metrics:\n{text[:2000]}"
        for ln in samples:
            got = labels(ln)
            assert (got.get("job"), got.get("node")) == (job, node.name) and "rank" in got, f"{node}: a series without its job, node or rank: {ln}"
        by_rank = {}
        for ln in samples:
            by_rank[labels(ln)["rank"]] = by_rank.get(labels(ln)["rank"], 0) + 1
        print(f"node {node.name}: {len(samples)} series on /metrics, by rank {by_rank}")
        ranks = {labels(ln)["rank"] for ln in samples} - {"all"}
        assert ranks == {str(2 * k), str(2 * k + 1)}, f"{node}: ranks on /metrics: {sorted(ranks)}"
    # The same, through Prometheus (honor_labels: the job label is the run's, not the scrape's).
    step = prom.query(f'pipeprof_step_seconds{{job="{job}",rank!="all"}}')
    where = sorted((s["metric"].get("node"), s["metric"].get("rank")) for s in step)
    assert where == [("a", "0"), ("a", "1"), ("b", "2"), ("b", "3")], f"pipeprof_step_seconds in Prometheus, (node, rank): {where}"

    # Ctrl-C on both nodes: SIGINT to each run's process group, as a terminal sends it. The runs
    # end, and still write their summaries and traces.
    for p, _ in runs.values():
        os.killpg(p.pid, signal.SIGINT)
    codes = wait_all(runs, "pipeprof run, after Ctrl-C,")

    # A summary per node, naming its node, the job and the node's rank, and its ranks on it.
    for k, name in enumerate(("a", "b")):
        path = shared / f"{name}.summary.json"
        assert path.exists(), f"no {path.name} after Ctrl-C (exit codes {codes}); the shared folder has {sorted(f.name for f in shared.iterdir())}\n" + logs()
        s = json.loads(path.read_text())
        node = s.get("settings", {}).get("node")
        # The name from the host name, the job from torchrun's --rdzv-id; no node rank (c10d numbers
        # the nodes as they join, and ignores the --node_rank pipeprof could read).
        assert node == {"name": name, "job": job}, f"{path.name}: settings.node is {node}"
        lines = {r["rank"]: r for r in s.get("ranks", [])}
        assert sorted(lines) == [2 * k, 2 * k + 1], f"{path.name}: ranks {sorted(lines)}, not node {name}'s global ranks"
        for r, line in lines.items():
            assert line.get("node") == name, f"{path.name}: rank {r} is on node {line.get('node')!r}, not {name!r}"
            assert line.get("world_size") == 4, f"{path.name}: rank {r}: world size {line.get('world_size')}, not 4"
            assert line.get("steps", 0) > 0, f"{path.name}: rank {r} counted no steps"

    # A trace per rank, each named after its node, with its global rank.
    for r in range(4):
        name = "ab"[r // 2]
        path = shared / f"{name}.trace.rank{r}.json"
        assert path.exists(), f"no {path.name}; the shared folder has {sorted(f.name for f in shared.iterdir())}"
        info = json.loads(path.read_text()).get("distributedInfo", {})
        assert (info.get("rank"), info.get("local_rank"), info.get("world_size")) == (r, r % 2, 4), f"{path.name}: distributedInfo {info}"
        assert (info.get("node"), info.get("job")) == (name, job), f"{path.name}: distributedInfo {info}, not node {name} of job {job}"

    # `pipeprof report` on the shared folder: a line per rank of both nodes, and the straggler.
    rep = subprocess.run([pipeprof_bin(), "report", str(shared)], capture_output=True, text=True, timeout=HANG_S)
    assert rep.returncode == 0, f"pipeprof report {shared}: exit {rep.returncode}\n{rep.stderr}"
    out = rep.stdout.splitlines()
    for r in range(4):
        assert any(re.match(rf"\s*rank {r}\b", ln) for ln in out), f"pipeprof report: no line for rank {r}:\n{rep.stdout}"
    said = [ln.strip() for ln in out if ln.startswith("straggler: ")]
    assert said in (["straggler: rank 2 on node b"], ["straggler: rank 3 on node b"]), f"pipeprof report: no `straggler: rank 2|3 on node b` line:\n{rep.stdout}"
    # … and what sets node b apart: its data behind the FUSE mount, node a's on the local disk.
    fs = {n: json.loads((shared / f"{n}.summary.json").read_text())["data_fs"] for n in "ab"}
    assert (fs["a"]["kind"], fs["b"]["kind"], fs["b"]["source"]) == ("Local", "Fuse", "slowfs"), fs
    want = f"· node b reads its data from a FUSE file system ({fs['b']['fs_type']}, slowfs), node a from a local one ({fs['a']['fs_type']})"
    assert want in rep.stdout, rep.stdout
    assert "→ on node b: copy the data set to a local disk, as the other nodes have it" in rep.stdout, rep.stdout
    # `--json`: the straggler as data, held against the schema.
    rep = subprocess.run([pipeprof_bin(), "report", str(shared), "--json"], capture_output=True, text=True, timeout=HANG_S)
    assert rep.returncode == 0, f"pipeprof report {shared} --json: exit {rep.returncode}\n{rep.stderr}"
    doc = json.loads(rep.stdout)
    assert verdict_errors(doc) == [], f"report --json against docs/schema/verdict.schema.json: {verdict_errors(doc)}"
    v = doc.get("straggler") or {}
    assert (v.get("rank") in (2, 3), v.get("node"), v.get("cause")) == (True, "b", "input"), f"report --json: straggler {v}"
    assert want[2:] in v.get("evidence", []), f"report --json: the node's difference in the evidence: {v}"
