"""Two "nodes" on this one machine, for a real multi-node run: two network namespaces, each with
its own host name, joined by a bridge in the root namespace.

    root namespace:  bridge ppnb<pid>  10.213.X.254/24   (a Prometheus here reaches both nodes)
                        │ ppv<pid>a          │ ppv<pid>b       (veth pairs; the far end is eth0)
    node a:  netns ppn<pid>a, eth0 10.213.X.1, lo up, host name "a"
    node b:  netns ppn<pid>b, eth0 10.213.X.2, lo up, host name "b"

Both nodes see the same file system (a shared folder is just a folder). Each node's /etc/hosts
(through `ip netns exec`'s /etc/netns/NS/ bind mounts, so the machine's own file is never
touched) names both nodes, as a cluster's DNS would: torchrun's c10d rendezvous finds out that
it hosts the store by resolving its own host name, and its ranks look the other node up by name.

A process runs on a node through `ip netns exec NS unshare --uts sh -c 'hostname N; exec …'`:
every one of those execs the next, so the Popen's pid is the command's own, the leader of a
session of its own (its process group: a terminal's Ctrl-C is `os.killpg(pid, SIGINT)`).

Names are the test process's pid, so that two sessions never meet, and everything is torn down
on `close()` (processes killed by process group, then every process left in a namespace,
namespaces, their hosts files, veths and the bridge), whatever happened before. Needs root and
iproute2's `ip`, util-linux's `unshare` and `hostname`: without them the test fails with a
message (it never skips).
"""

import os
import re
import shutil
import signal
import subprocess
import time

import pytest

#: The tools the nodes are made with.
TOOLS = ("ip", "unshare", "hostname")


def _ip(*args, check=True):
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p


def require_tools():
    """Fail (never skip) with a clear message when the nodes cannot be made here."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not on PATH: the two-node test makes network namespaces with iproute2's `ip` "
            "and host names with util-linux's `unshare` and `hostname` (apt-get install iproute2 util-linux hostname)"
        )
    if os.geteuid() != 0:
        pytest.fail("the two-node test makes network namespaces and a bridge: it runs as root (CAP_NET_ADMIN, CAP_SYS_ADMIN)")


def _free_subnet(seed):
    """X of a 10.213.X.0/24 that no interface or route of the root namespace uses yet."""
    used = _ip("-4", "addr").stdout + _ip("-4", "route").stdout
    for i in range(250):
        x = 1 + (seed + i) % 250
        if f"10.213.{x}." not in used:
            return x
    raise RuntimeError("no free 10.213.X.0/24 subnet for the nodes' bridge")


def _alive(pid):
    return os.path.exists(f"/proc/{pid}")


def _kill_all_in(ns):
    """SIGKILL every process in network namespace `ns` until none is left; what is left."""
    for _ in range(50):
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        if not pids:
            return []
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)  # teardown only: the killed processes are reaped by their parents
    return _ip("netns", "pids", ns, check=False).stdout.split()


def sweep_stale():
    """Namespaces and bridges of this harness whose test process is gone (a session killed
    before its teardown): removed, so that they hold no subnet and no name."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        m = re.fullmatch(r"ppn(\d+)[a-z]", line.split()[0]) if line.strip() else None
        if m and not _alive(int(m.group(1))):
            _kill_all_in(line.split()[0])
            _ip("netns", "del", line.split()[0], check=False)
            shutil.rmtree(f"/etc/netns/{line.split()[0]}", ignore_errors=True)
    for m in re.finditer(r"^\d+: (ppnb(\d+))[:@]", _ip("-o", "link", "show", "type", "bridge", check=False).stdout, re.M):
        if not _alive(int(m.group(2))):
            _ip("link", "del", m.group(1), check=False)


class Node:
    def __init__(self, name, ns, veth, addr):
        self.name, self.ns, self.veth, self.addr = name, ns, veth, addr

    def __repr__(self):
        return f"node {self.name} ({self.ns}, {self.addr})"


class TwoNodes:
    """Nodes "a" (10.213.X.1) and "b" (10.213.X.2) and the bridge between them (10.213.X.254)."""

    def __init__(self, names=("a", "b")):
        require_tools()
        sweep_stale()
        pid = os.getpid()
        self.bridge = f"ppnb{pid}"
        self.procs = []
        self.nodes = []
        self.x = None
        try:
            self.x = _free_subnet(pid)
            self.gateway = f"10.213.{self.x}.254"
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, name in enumerate(names, 1):
                node = Node(name, f"ppn{pid}{name}", f"ppv{pid}{name}", f"10.213.{self.x}.{i}")
                self.nodes.append(node)
                _ip("netns", "add", node.ns)
                # The pair's far end goes straight into the namespace, as its eth0.
                _ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.ns)
                _ip("link", "set", node.veth, "master", self.bridge, "up")
                _ip("-n", node.ns, "addr", "add", f"{node.addr}/24", "dev", "eth0")
                _ip("-n", node.ns, "link", "set", "eth0", "up")
                _ip("-n", node.ns, "link", "set", "lo", "up")
            hosts = "127.0.0.1 localhost\n" + "".join(f"{n.addr} {n.name}\n" for n in self.nodes)
            for n in self.nodes:
                etc = f"/etc/netns/{n.ns}"
                os.makedirs(etc, exist_ok=True)
                with open(f"{etc}/hosts", "w") as f:
                    f.write(hosts)
        except BaseException:
            self.close()
            raise

    def __getitem__(self, name):
        return next(n for n in self.nodes if n.name == name)

    def argv(self, node, cmd):
        """`cmd` as run on `node`: in its network namespace, under its own host name."""
        return ["ip", "netns", "exec", node.ns, "unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', node.name, *map(str, cmd)]

    def popen(self, node, cmd, **kw):
        """Start `cmd` on `node`, the leader of a session of its own; killed on close()."""
        p = subprocess.Popen(self.argv(node, cmd), start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def run(self, node, cmd, timeout, **kw):
        """Run `cmd` on `node` to its end (killed with its process group past `timeout`), its
        output captured."""
        p = self.popen(node, cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(p)
            out, err = p.communicate()
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    @staticmethod
    def kill(p, sig=signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self):
        """Tear it all down, each step whatever the one before it did; raise at the end if
        something is left."""
        problems = []
        for p in self.procs:
            if p.poll() is None:
                self.kill(p)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                problems.append(f"pid {p.pid} did not die")
        # What left its process group (a launcher's workers in sessions of their own) is still
        # in its node's namespace: `ip netns pids` finds it.
        for n in self.nodes:
            left = _kill_all_in(n.ns)
            if left:
                problems.append(f"{n}: processes left: {left}")
        for n in self.nodes:
            d = _ip("netns", "del", n.ns, check=False)
            if d.returncode != 0 and "No such file" not in d.stderr:
                problems.append(f"ip netns del {n.ns}: {d.stderr.strip()}")
            shutil.rmtree(f"/etc/netns/{n.ns}", ignore_errors=True)
            try:
                os.rmdir("/etc/netns")  # when no other namespace has a folder there
            except OSError:
                pass
            # Deleting the namespace deletes the pair, but not at once: delete it here as well.
            _ip("link", "del", n.veth, check=False)
        d = _ip("link", "del", self.bridge, check=False)
        if d.returncode != 0 and "Cannot find device" not in d.stderr:
            problems.append(f"ip link del {self.bridge}: {d.stderr.strip()}")
        left = [n.ns for n in self.nodes if n.ns in _ip("netns", "list", check=False).stdout.split()]
        if _ip("link", "show", self.bridge, check=False).returncode == 0:
            left.append(self.bridge)
        if left:
            problems.append(f"left behind: {left}")
        self.procs, self.nodes = [], []
        if problems:
            raise RuntimeError("; ".join(problems))
