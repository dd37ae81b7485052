"""Helpers of the control-plane benchmarks (bench/control_plane/*.py):
starting shardline-coordinator, etcd and a torch TCPStore server on free
ports, running the C++ load generator cp_load and reading its JSON answer.

    coord = Coordinator()            # shardline-coordinator --state memory
    res = cp_load("kv", target="shardline", address=coord.address, clients=4, seconds=1)
    coord.stop()

Every server is its own process on 127.0.0.1; every helper that starts one
also stops it (stop()), so a failed case does not leave processes behind.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # bench/, for benchlib

import benchlib  # noqa: E402

# Debian's python3-torch lives in the system interpreter; a pyenv or venv
# python3 earlier on PATH does not see it.
PYTHON = "/usr/bin/python3"


def bin_path(rel):
    """A binary of the -c opt build, e.g. bin_path("server/shardline-coordinator")."""
    root = benchlib.bench_bin()
    if not os.path.isabs(root):
        root = os.path.join(REPO, root)
    p = os.path.join(root, rel)
    if not os.path.exists(p):
        raise FileNotFoundError(
            "%s is missing; build it with bazel build --config=ci -c opt "
            "//bench/control_plane:cp_load //server:shardline-coordinator "
            "//worker:shardline-worker //client/shardctl" % p)
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def tmpdir(name):
    d = os.path.join(benchlib.bench_tmp(), "control_plane", name)
    os.makedirs(d, exist_ok=True)
    return d


class Server:
    """A child process with its output in a log file; stop() ends it."""

    def __init__(self, argv, log_path, env=None):
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def alive(self):
        return self.proc.poll() is None

    def tail(self, n=20):
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


class Coordinator(Server):
    """shardline-coordinator on a free port, no auth; state in memory unless `state` names a file."""

    def __init__(self, name="coordinator", state="memory"):
        self.port = free_port()
        self.address = "127.0.0.1:%d" % self.port
        super().__init__([bin_path("server/shardline-coordinator"), "--listen", self.address,
                          "--state", state],
                         os.path.join(tmpdir("logs"), name + ".log"))
        if not wait_port(self.port, 30):
            self.stop()
            raise RuntimeError("shardline-coordinator did not start: " + self.tail())


class Etcd(Server):
    """etcd 3.4, one member, data directory on tmpfs (/dev/shm) when there is one."""

    def __init__(self, name="etcd"):
        self.port = free_port()
        peer = free_port()
        self.address = "127.0.0.1:%d" % self.port
        base = "/dev/shm" if os.path.isdir("/dev/shm") else benchlib.bench_tmp()
        self.data = os.path.join(base, "shardline-bench-etcd-%d" % os.getpid())
        subprocess.run(["rm", "-rf", self.data])
        super().__init__(["etcd", "--name", "bench", "--data-dir", self.data,
                          "--listen-client-urls", "http://" + self.address,
                          "--advertise-client-urls", "http://" + self.address,
                          "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
                          "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
                          "--initial-cluster", "bench=http://127.0.0.1:%d" % peer,
                          "--log-level", "warn", "--quota-backend-bytes", str(4 << 30)],
                         os.path.join(tmpdir("logs"), name + ".log"))
        # etcd answers GET /health on its client port once it serves
        # (no etcdctl needed: etcd-server does not depend on etcd-client).
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with urllib.request.urlopen("http://%s/health" % self.address, timeout=2) as r:
                    if b'"health":"true"' in r.read().replace(b" ", b""):
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("etcd did not start: " + self.tail())

    def stop(self):
        super().stop()
        subprocess.run(["rm", "-rf", self.data])


class TorchStore(Server):
    """A torch.distributed.TCPStore server (is_master=True) in its own process."""

    def __init__(self, name="tcpstore"):
        self.port = free_port()
        code = ("import time, datetime\n"
                "from torch.distributed import TCPStore\n"
                "s = TCPStore('127.0.0.1', %d, None, True, datetime.timedelta(seconds=600),"
                " wait_for_workers=False)\n"
                "print('ready', flush=True)\n"
                "time.sleep(1e9)\n" % self.port)
        super().__init__([PYTHON, "-c", code], os.path.join(tmpdir("logs"), name + ".log"))
        if not wait_port(self.port, 60):
            self.stop()
            raise RuntimeError("TCPStore server did not start: " + self.tail())


def cp_load(mode, timeout=900, **flags):
    """Runs cp_load MODE --flag value ...; returns its JSON object (raises on failure)."""
    argv = [bin_path("bench/control_plane/cp_load"), mode]
    for k, v in flags.items():
        argv += ["--" + k.replace("_", "-"), str(v)]
    return run_json(argv, timeout)


def run_json(argv, timeout):
    benchlib.log("  $ " + " ".join(argv))
    # Its own process group, so that a timeout also ends the processes it forked.
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise RuntimeError("%s did not finish within %d s" % (os.path.basename(argv[-1] if
                           argv[0] == PYTHON else argv[0]), timeout))
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # anything it left behind
        except ProcessLookupError:
            pass
    out = stdout.decode(errors="replace").strip().splitlines()
    if p.returncode != 0 or not out:
        raise RuntimeError("%s failed (exit %d): %s %s" % (
            os.path.basename(argv[0]), p.returncode, " ".join(out[-3:]),
            stderr.decode(errors="replace")[-2000:]))
    res = json.loads(out[-1])
    if "error" in res:
        raise RuntimeError(res["error"])
    return res
