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


def read(path):
    """A log file's text so far ("" while it does not exist)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def wait_until(fn, timeout, poll=0.05):
    """fn()'s first truthy value within `timeout` seconds, else None."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(poll)
    return None


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
    """A torch.distributed.TCPStore server (is_master=True) in its own process,
    under `python` (Debian's torch by default; benchlib.torch_peers for others)."""

    def __init__(self, name="tcpstore", python=PYTHON):
        self.port = free_port()
        code = ("import time, datetime\n"
                "from torch.distributed import TCPStore\n"
                "s = TCPStore('127.0.0.1', %d, None, True, datetime.timedelta(seconds=600),"
                " wait_for_workers=False)\n"
                "print('ready', flush=True)\n"
                "time.sleep(1e9)\n" % self.port)
        super().__init__([python, "-c", code], os.path.join(tmpdir("logs"), name + ".log"))
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


def etcd_env():
    """The environment without ETCD_* variables (etcd reads them as flags)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}


def etcd_healthy(address, timeout=2):
    try:
        with urllib.request.urlopen("http://%s/health" % address, timeout=timeout) as r:
            return b'"health":"true"' in r.read().replace(b" ", b"")
    except OSError:
        return False


class EtcdCluster:
    """etcd 3.4 with `size` members on loopback (as testing/etcd_cluster.cc starts
    it), data directories on tmpfs when there is one (on_disk: under $BENCH_TMP,
    where etcd's fsyncs cost what they would); url(prefix) is the
    coordinator's --state etcd://A,B,C/PREFIX."""

    def __init__(self, name="etcd3", size=3, on_disk=False):
        base = "/dev/shm" if os.path.isdir("/dev/shm") and not on_disk else benchlib.bench_tmp()
        self.data = os.path.join(base, "shardline-bench-%s-%d" % (name, os.getpid()))
        subprocess.run(["rm", "-rf", self.data])
        ports = [(free_port(), free_port()) for _ in range(size)]
        self.addresses = ["127.0.0.1:%d" % c for c, _ in ports]
        cluster = ",".join("m%d=http://127.0.0.1:%d" % (i, p) for i, (_, p) in enumerate(ports))
        self.members = []
        try:
            for i, (client, peer) in enumerate(ports):
                self.members.append(Server(
                    ["etcd", "--name", "m%d" % i, "--data-dir", os.path.join(self.data, "m%d" % i),
                     "--listen-client-urls", "http://127.0.0.1:%d" % client,
                     "--advertise-client-urls", "http://127.0.0.1:%d" % client,
                     "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
                     "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
                     "--initial-cluster", cluster, "--initial-cluster-state", "new",
                     "--initial-cluster-token", "bench-%d" % os.getpid(),
                     "--log-level", "warn", "--quota-backend-bytes", str(4 << 30)],
                    os.path.join(tmpdir("logs"), "%s-m%d.log" % (name, i)), env=etcd_env()))
            deadline = time.time() + 60
            while time.time() < deadline:
                if all(etcd_healthy(a) for a in self.addresses):
                    return
                time.sleep(0.2)
            raise RuntimeError("etcd cluster did not become healthy: " +
                               " | ".join(m.tail(3) for m in self.members))
        except BaseException:
            self.stop()
            raise

    def url(self, prefix):
        return "etcd://%s/%s" % (",".join(self.addresses), prefix.lstrip("/"))

    def stop(self):
        for m in self.members:
            m.stop()
        subprocess.run(["rm", "-rf", self.data])


def shardctl(args, coordinator, timeout_s=2):
    """shardctl --coordinator C --timeout Ns ARGS...; returns (exit code, output)."""
    env = dict(os.environ)
    env.pop("SHARDLINE_TOKEN", None)
    env.pop("SHARDLINE_COORDINATOR", None)
    argv = [bin_path("client/shardctl/shardctl"), "--coordinator", coordinator,
            "--timeout", "%gs" % timeout_s] + list(args)
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                           timeout=timeout_s + 10)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    return p.returncode, p.stdout.decode(errors="replace")


class Replicas:
    """`n` shardline-coordinator replicas on one etcd prefix, each on a fixed
    port (a restarted one comes back at its address)."""

    def __init__(self, cluster, prefix, n=3, lease_ttl_s=2, name="replica"):
        self.argv = []
        self.cluster, self.prefix = cluster, prefix.strip("/")
        self.addresses = ["127.0.0.1:%d" % free_port() for _ in range(n)]
        self.name = name
        self.starts = 0
        self.procs = [None] * n
        for i, a in enumerate(self.addresses):
            self.argv.append([bin_path("server/shardline-coordinator"), "--listen", a,
                              "--state", cluster.url(prefix), "--replica-id", "r%d" % i,
                              "--lease-ttl", "%ds" % lease_ttl_s])
        try:
            for i in range(n):
                self.start(i)
        except BaseException:
            self.stop()
            raise

    def start(self, i):
        self.starts += 1
        self.procs[i] = Server(self.argv[i], os.path.join(
            tmpdir("logs"), "%s%d-%d.log" % (self.name, i, self.starts)))
        if not wait_port(int(self.addresses[i].rsplit(":", 1)[1]), 30):
            raise RuntimeError("replica %d did not start: %s" % (i, self.procs[i].tail()))

    def leader(self, timeout=30):
        """The index of the replica that PREFIX/leader in etcd names and that answers
        `shardctl job list` (a client that follows the leader hint would get an
        answer from any replica, so the answer alone does not tell), or raises."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = subprocess.run(
                ["etcdctl", "--endpoints=" + ",".join(self.cluster.addresses), "get",
                 "/" + self.prefix + "/leader", "--print-value-only"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=etcd_env()).stdout
            for i, a in enumerate(self.addresses):
                if a.encode() in value and self.procs[i] is not None and \
                        self.procs[i].alive() and shardctl(["job", "list"], a, 1)[0] == 0:
                    return i
            time.sleep(0.05)
        raise RuntimeError("no replica leads after %d s: %s" % (
            timeout, " | ".join(p.tail(3) for p in self.procs if p is not None)))

    def kill(self, i):
        """SIGKILL replica i (its process group); returns the time just after."""
        os.killpg(self.procs[i].proc.pid, signal.SIGKILL)
        t = time.time()
        self.procs[i].proc.wait()
        self.procs[i].stop()
        return t

    def stop(self):
        for p in self.procs:
            if p is not None:
                p.stop()


# The tiny GPT job of node_loss and failover (a 2-layer model of hidden size
# 16 on the repository's corpus, a checkpoint every 5 steps, as good as
# endless): its spec file's text.
_TINY_GPT_SPEC = """\
name: {name}
model:
  num_layers: 2
  hidden_size: 16
  num_heads: 2
  vocab_size: 256
  seq_length: 16
parallel:
  tp: 1
  pp: 1
  zero_stage: 0
training:
  global_batch: 24
  micro_batch: 2
  train_steps: 1000000
  learning_rate: 3.0e-3
  min_learning_rate: 3.0e-4
  warmup_steps: 4
  weight_decay: 0.1
  grad_clip: 1.0
  seed: 7
data:
  dataset_path: {data}
  validation_fraction: 0.1
checkpoint:
  directory: {ckpt}
  interval_steps: 5
  keep_last: 2
elastic:
  min_workers: {min_workers}
  max_workers: {max_workers}
  heartbeat_interval: {heartbeat_interval}
  heartbeat_timeout: {heartbeat_timeout}
  last_call: 500ms
  join_timeout: 60s
  collective_timeout: {collective_timeout}
{extra_elastic}"""


def tiny_gpt_spec(name, data, ckpt, min_workers, max_workers, heartbeat_interval,
                  heartbeat_timeout, extra_elastic="", collective_timeout="20s"):
    """The tiny GPT job's YAML; `extra_elastic`: more "  key: value" lines of
    its elastic section."""
    return _TINY_GPT_SPEC.format(name=name, data=data, ckpt=ckpt, min_workers=min_workers,
                                 max_workers=max_workers, heartbeat_interval=heartbeat_interval,
                                 heartbeat_timeout=heartbeat_timeout, extra_elastic=extra_elastic,
                                 collective_timeout=collective_timeout)


def start_torchrun_agents(d, workers, rdzv_id, env, python=PYTHON):
    """Starts `workers` torchrun agents (c10d rendezvous on a free port, up
    to 3 restarts, last_call_timeout 5 s) running _torch_ddp_train.py with
    `env` under `python` (whose torch they use); each logs to d/agentI.log.
    Returns the Servers (the caller stops them)."""
    port = free_port()
    agents = []
    for i in range(workers):
        agents.append(Server(
            [python, os.path.join(HERE, "_torchrun.py"),
             "--nnodes=1:%d" % workers,
             "--nproc_per_node=1", "--max_restarts=3", "--rdzv_backend=c10d",
             "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_id=%s" % rdzv_id,
             "--rdzv_conf=last_call_timeout=5", "--monitor_interval=0.1",
             os.path.join(HERE, "_torch_ddp_train.py")],
            os.path.join(d, "agent%d.log" % i), env=env))
        time.sleep(0.2)  # the first agent hosts the TCPStore
    return agents
