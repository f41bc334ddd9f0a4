"""`pipeprof mcp` driven by a real MCP client: the official Python `mcp` package over stdio.
It lists the tools, runs the torchvision example through `run_training` (bounded to its
steps), gets the verdict the command line gives for the same run, gets structured errors for
bad arguments; a call it cancels stops its program, and, disconnecting mid-run, it leaves no
process behind."""

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from conftest import HANG_S, REPO, pipeprof_bin, verdict_errors

TORCHVISION = REPO / "python" / "examples" / "train_torchvision.py"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A small ImageFolder: 2 classes × 16 PNG images, 40×40."""
    from PIL import Image

    root = tmp_path_factory.mktemp("imgs")
    for c, colour in enumerate([(200, 30, 30), (30, 30, 200)]):
        d = root / f"class{c}"
        d.mkdir()
        for i in range(16):
            img = Image.new("RGB", (40, 40), colour)
            img.putpixel((i, i), (255, 255, 255))
            img.save(d / f"{i}.png")
    return root


def server_env(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    for k in ("PIPEPROF_PARENT", "PIPEPROF_PARENT_PID", "PIPEPROF_MAIN_PID", "PIPEPROF_LISTEN", "PIPEPROF_CHECK"):
        env.pop(k, None)
    return env


def session(tmp_path, env=None):
    """The client's connection to `pipeprof mcp`, started as an agent starts it."""
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=pipeprof_bin(), args=["mcp"], env=dict(server_env(tmp_path), **(env or {})), cwd=str(tmp_path))
    return stdio_client(params)


async def with_client(tmp_path, body, env=None):
    from mcp import ClientSession

    async with session(tmp_path, env) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            assert init.server_info.name == "pipeprof", init.server_info
            return await asyncio.wait_for(body(s), HANG_S)


def test_an_agent_lists_the_tools_and_gets_the_verdict_of_a_bounded_run(tmp_path, images):
    summary = tmp_path / "mcp-run.json"

    async def body(s):
        tools = {t.name: t for t in (await s.list_tools()).tools}
        run = await s.call_tool(
            "run_training",
            {
                "command": [sys.executable, str(TORCHVISION), "--data", str(images), "--batch-size", "4", "--epochs", "5"],
                "steps": 10,
                "timeout_s": HANG_S,
                "summary": str(summary),
            },
        )
        return tools, run

    tools, run = asyncio.run(with_client(tmp_path, body))
    assert set(tools) == {"run_training", "check_advice", "report_summary", "compare_runs"}, tools
    assert "command" in tools["run_training"].input_schema["properties"]
    assert not run.is_error, run.content
    doc = run.structured_content
    assert verdict_errors(doc) == [], verdict_errors(doc)
    # Bounded: the hook stopped the 40-step program after the 10 asked for.
    assert doc["numbers"]["steps"] == 10, doc["numbers"]
    assert doc["status"] == "verdict" and doc["numbers"]["batch_size"] == 4, doc
    assert json.loads(run.content[0].text) == doc
    # The verdict the command line gives on the same run.
    cli = subprocess.run([pipeprof_bin(), "report", str(summary), "--json"], capture_output=True, text=True, check=True)
    by_cli = json.loads(cli.stdout)
    for key in ("status", "limiter", "severity", "headline", "evidence", "flags", "advice", "numbers"):
        assert doc[key] == by_cli[key], key


def test_the_tools_give_what_the_command_line_gives_and_errors_are_structured(tmp_path, images):
    summary = tmp_path / "s.json"
    cli = subprocess.run(
        [pipeprof_bin(), "run", "--once", "--no-gpu", "--json", "--summary", str(summary), "--",
         sys.executable, str(TORCHVISION), "--data", str(images), "--batch-size", "4"],  # fmt: skip
        capture_output=True, text=True, env=server_env(tmp_path), timeout=HANG_S, cwd=tmp_path,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    by_cli = json.loads(subprocess.run([pipeprof_bin(), "report", str(summary), "--json"], capture_output=True, text=True, check=True).stdout)

    async def body(s):
        report = await s.call_tool("report_summary", {"path": str(summary)})
        compare = await s.call_tool("compare_runs", {"base": str(summary), "new": str(summary), "max_slowdown_pct": 10})
        missing = await s.call_tool("report_summary", {"path": str(tmp_path / "nope.json")})
        from mcp.shared.exceptions import MCPError

        with pytest.raises(MCPError) as bad:
            await s.call_tool("run_training", {"command": [], "steps": 10})
        return report, compare, missing, bad.value

    report, compare, missing, bad = asyncio.run(with_client(tmp_path, body))
    assert not report.is_error and report.structured_content == by_cli
    assert json.loads(cli.stdout)["headline"] == by_cli["headline"]
    assert compare.structured_content["schema"] == "pipeprof.compare/1" and compare.structured_content["passed"] is True
    # Errors come back as errors, with the reason, never a hung call.
    # A tool that ran and failed says so in its result; arguments out of bounds are the
    # protocol's invalid-params error (-32602), before anything runs.
    assert missing.is_error and "nope.json" in missing.structured_content["error"], missing.content
    assert bad.code == -32602 and "command is empty" in str(bad), bad


HANGS = """
import os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

open(sys.argv[1], "w").write(str(os.getpid()))

class Slow(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.zeros(3, 8, 8), 0

for xs, ys in DataLoader(Slow(), batch_size=4, num_workers=1):
    pass
"""


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def tagged(tag):
    """The processes whose environment carries `tag`: the server and everything it started
    (children inherit it), and nothing else on the machine."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if tag.encode() in f.read().split(b"\0"):
                    found.append(int(d))
        except OSError:
            continue
    return [p for p in found if alive(p)]


def until(done, what):
    """Waits for `done()` (a guard against a hang, not a timing)."""
    deadline = time.monotonic() + HANG_S
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_cancelled_call_stops_its_run_and_a_client_that_leaves_leaves_no_process(tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text(textwrap.dedent(HANGS))
    tag = f"PIPEPROF_TEST_TAG={uuid.uuid4()}"
    first, second = tmp_path / "pid1", tmp_path / "pid2"

    def started(f):
        return f.exists() and f.read_text() != ""

    def call(s, pid_file):
        args = {"command": [sys.executable, str(script), str(pid_file)], "steps": 100000, "timeout_s": 3600}
        return asyncio.ensure_future(s.call_tool("run_training", args))

    async def wait_for(cond, what):
        deadline = time.monotonic() + HANG_S
        while not cond():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.1)

    async def body(s):
        # A call the agent cancels: its program stops, the server stays.
        run = call(s, first)
        await wait_for(lambda: started(first), "the first program never started")
        run.cancel()
        program = int(first.read_text())
        await wait_for(lambda: not alive(program), "the cancelled call's program still runs")
        assert {t.name for t in (await s.list_tools()).tools}, "the server still answers"
        # A call still running when the client leaves.
        call(s, second)
        await wait_for(lambda: started(second), "the second program never started")
        return tagged(tag)

    key, value = tag.split("=", 1)
    running = asyncio.run(with_client(tmp_path, body, {key: value}))
    assert int(second.read_text()) in running, running
    # Leaving the client's context closed the server's stdin: the client is gone.
    until(lambda: tagged(tag) == [], f"still running after the client left: {tagged(tag)}")
