"""Helpers: run a scenario script in its own process (init is once per process) and watch
it with the real `pipeprof attach` binary."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A hang guard, not a timing: a scenario that has not ended by then is stuck.
HANG_S = 120


#: The parent's pipeprof settings a run of its own must not inherit.
INHERITED = ("PIPEPROF_PARENT", "PIPEPROF_PARENT_PID", "PIPEPROF_MAIN_PID", "PIPEPROF_LISTEN", "PIPEPROF_CHECK")


def corpus_env(tmp_path_factory, python, make, threads, **extra):
    """The environment of a corpus script's runs: its generated data (`make`, run by `python`
    in python/corpus/) in a folder of the test's, a private runtime folder, none of a parent
    run's settings, the frameworks' math on `threads` (a dict of variables) and `extra`."""
    data = tmp_path_factory.mktemp("corpus-data")
    runtime = tmp_path_factory.mktemp("run")
    runtime.chmod(0o700)
    e = dict(os.environ, CORPUS_DATA=str(data), XDG_RUNTIME_DIR=str(runtime), PYTHONUNBUFFERED="1", **extra)
    for k in INHERITED:
        e.pop(k, None)
    e.update(threads)
    subprocess.run([python, "-c", make], cwd=REPO / "python" / "corpus", env=e, check=True, timeout=HANG_S)
    return e


def verdict_errors(doc):
    """What a real JSON Schema validator (the `jsonschema` package) finds wrong with a
    `--json` document against docs/schema/verdict.schema.json: empty when it holds."""
    import jsonschema

    schema = json.loads((REPO / "docs" / "schema" / "verdict.schema.json").read_text())
    v = jsonschema.Draft202012Validator(schema)
    return [f"{e.message} at {list(e.absolute_path)}" for e in v.iter_errors(doc)]


@pytest.fixture(scope="session", autouse=True)
def every_summary_holds_as_a_verdict(tmp_path_factory):
    """At the end of the session, every summary file a test wrote under pytest's temporary
    folders (a JSON object with `schema_version` and `stages`: the corpus's, the distributed
    run's, the notebooks', …) holds against docs/schema/summary.schema.json, and is read back by
    `pipeprof report --json` into a document that holds against the verdict's schema. A file a
    test planted broken, which `report` refuses, is no summary of a run and is not held to it."""
    yield
    import jsonschema

    summary_schema = json.loads((REPO / "docs" / "schema" / "summary.schema.json").read_text())
    check_summary = jsonschema.Draft202012Validator(summary_schema)
    bad = []
    for f in sorted(tmp_path_factory.getbasetemp().rglob("*.json")):
        try:
            head = json.loads(f.read_text())
        except (ValueError, UnicodeDecodeError, OSError):
            continue
        if not (isinstance(head, dict) and "schema_version" in head and "stages" in head):
            continue
        p = subprocess.run([pipeprof_bin(), "report", str(f), "--json"], capture_output=True, text=True, timeout=HANG_S)
        if p.returncode != 0:
            continue
        bad += [f"{f}: summary: {e.message} at {list(e.absolute_path)}" for e in check_summary.iter_errors(head)]
        bad += [f"{f}: report --json: {e}" for e in verdict_errors(json.loads(p.stdout))]
    assert not bad, "\n".join(bad[:20])


def pipeprof_bin():
    p = Path(os.environ.get("PIPEPROF_BIN", REPO / "target" / "release" / "pipeprof"))
    if not p.exists():
        pytest.fail(f"{p} missing: build it with `cargo build --release` (scripts/test.sh does), or set PIPEPROF_BIN")
    return str(p)


class Run:
    """A scenario process and the runtime folder it serves from."""

    def __init__(self, tmp_path, code, args=()):
        self.tmp = tmp_path
        runtime = tmp_path / "run"
        runtime.mkdir(mode=0o700)
        self.env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYTHONUNBUFFERED="1")
        for k in ("PIPEPROF_PARENT", "PIPEPROF_PARENT_PID", "PIPEPROF_LISTEN"):
            self.env.pop(k, None)
        script = tmp_path / "scenario.py"
        script.write_text(textwrap.dedent(code))
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            text=True,
            cwd=tmp_path,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("attach: "):
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"the scenario did not print its address first: {line!r}\n{out}\n{err}")
        self.address = line.strip().removeprefix("attach: ")

    def attach(self, *args):
        """`pipeprof attach ADDR --once --summary FILE ARGS`: (summary dict, stdout, stderr)."""
        out_json = self.tmp / "summary.json"
        cmd = [pipeprof_bin(), "attach", self.address, "--once", "--summary", str(out_json), *args]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=HANG_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail("pipeprof attach did not end: the run never said it ended")
        assert p.returncode == 0, p.stderr
        return json.loads(out_json.read_text()), p.stdout, p.stderr

    def wait(self):
        """The scenario's exit: (returncode, stdout after the address line, stderr)."""
        try:
            out, err = self.proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"the scenario hung:\n{out}\n{err}")
        return self.proc.returncode, out, err


def stage(summary, name):
    """A stage's entry in the summary JSON ({} when it never ran)."""
    return next((s for s in summary["stages"] if s["stage"] == name), {})


def count(summary, name):
    return stage(summary, name).get("count", 0)


@pytest.fixture
def scenario(tmp_path):
    runs = []

    def start(code, args=()):
        r = Run(tmp_path, code, args)
        runs.append(r)
        return r

    yield start
    for r in runs:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.communicate()
