"""The real shardline-coordinator for Python tests, on a free loopback port.

    from coordinator import Coordinator
    with Coordinator() as c:                       # no auth, --state memory
        client = shardline.Client(c.address)
    with Coordinator(admin_token=Coordinator.ADMIN_TOKEN, state_dir=tmp) as c:
        ...                                        # auth on, SQLite state in tmp
        c.restart()                                # same port, same state

The binary: $SHARDLINE_COORDINATOR_BINARY (the Bazel tests set it to
//server:shardline-coordinator), else bazel-bin/server/shardline-coordinator
of the source tree (run `bazel build //server:shardline-coordinator`).
(Not $SHARDLINE_COORDINATOR: that one is the coordinator's address for
shardctl and the workers.)

The coordinator is started with --listen 127.0.0.1:0 (the kernel picks a free
port) and its "listening on HOST:PORT" line is waited for; its stdout and
stderr go to files in `log_dir` (a temporary folder by default), shown by
`logs()` when a test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import List, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
# python/tests -> the repository root
_SOURCE_ROOT = os.path.dirname(os.path.dirname(_HERE))

BINARY_ENV = "SHARDLINE_COORDINATOR_BINARY"


def coordinator_binary() -> str:
    """The coordinator binary's path; RuntimeError saying how to build it when there is none."""
    path = os.environ.get(BINARY_ENV)
    if path:
        if not os.path.isabs(path):
            # Bazel's $(rootpath): relative to the runfiles' workspace folder.
            srcdir = os.environ.get("TEST_SRCDIR")
            workspace = os.environ.get("TEST_WORKSPACE", "")
            if srcdir:
                path = os.path.join(srcdir, workspace, path)
        if not os.access(path, os.X_OK):
            raise RuntimeError("$%s=%s is not an executable" % (BINARY_ENV, path))
        return path
    path = os.path.join(_SOURCE_ROOT, "bazel-bin", "server", "shardline-coordinator")
    if os.access(path, os.X_OK):
        return path
    raise RuntimeError("no coordinator binary: set $%s, or run `bazel build "
                       "//server:shardline-coordinator` in %s" % (BINARY_ENV, _SOURCE_ROOT))


def repo_path(rel: str) -> str:
    """A file of the repository: from the Bazel test's runfiles (it must be
    in the test's data), else from the source tree."""
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, os.environ.get("TEST_WORKSPACE", ""), rel)
    return os.path.join(_SOURCE_ROOT, rel)


def binary_path(rel: str) -> str:
    """A built program, e.g. "client/shardctl/shardctl": from the runfiles
    (in the test's data), else bazel-bin/ of the source tree."""
    path = repo_path(rel) if os.environ.get("TEST_SRCDIR") else \
        os.path.join(_SOURCE_ROOT, "bazel-bin", rel)
    if not os.access(path, os.X_OK):
        raise RuntimeError("no %s: add it to the test's data, or `bazel build` it" % rel)
    return path


class Coordinator:
    """One shardline-coordinator process (a context manager: started on enter, killed on exit).

    Args:
        admin_token: turns authentication on with this admin token (>= 16
            bytes; passed in a 0600 file, --admin-token-file); None: no auth.
        state_dir: keep the state in SQLite at state_dir/coordinator.db
            (survives restart()); None: --state memory.
        state: the --state value itself (e.g. Etcd.url(prefix) for a
            replica); overrides state_dir.
        args: more coordinator flags.
        start_timeout: seconds to wait for "listening on".

    Attributes (after start): address ("127.0.0.1:PORT"), port, process.
    """

    #: An admin token for tests that turn auth on.
    ADMIN_TOKEN = "test-admin-token-0123456789abcdef"

    def __init__(self, *, admin_token: Optional[str] = None, state_dir: Optional[str] = None,
                 state: Optional[str] = None, args: Sequence[str] = (), start_timeout: float = 20.0,
                 log_dir: Optional[str] = None) -> None:
        self.admin_token = admin_token
        self.state_dir = state_dir
        self.state = state
        self.extra_args = list(args)
        self.start_timeout = start_timeout
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="shardline-coordinator-",
                                                   dir=os.environ.get("TEST_TMPDIR"))
        self.address: Optional[str] = None
        self.port = 0
        self.process: Optional[subprocess.Popen] = None
        self._starts = 0

    def _command(self) -> List[str]:
        listen = "127.0.0.1:%d" % self.port
        state = "memory"
        if self.state is not None:
            state = self.state
        elif self.state_dir is not None:
            os.makedirs(self.state_dir, exist_ok=True)
            state = os.path.join(self.state_dir, "coordinator.db")
        cmd = [coordinator_binary(), "--listen", listen, "--state", state]
        if self.admin_token is not None:
            token_file = os.path.join(self.log_dir, "admin-token")
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.admin_token + "\n")
            cmd += ["--admin-token-file", token_file]
        return cmd + self.extra_args

    def start(self) -> "Coordinator":
        """Starts the process (on the port of the first start, after a stop) and waits until it serves."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("the coordinator is running already")
        self._starts += 1
        out_path = os.path.join(self.log_dir, "coordinator.%d.out" % self._starts)
        err_path = os.path.join(self.log_dir, "coordinator.%d.err" % self._starts)
        env = dict(os.environ)
        for name in ("SHARDLINE_ADMIN_TOKEN", "SHARDLINE_COORDINATOR", "SHARDLINE_TOKEN"):
            env.pop(name, None)
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            self.process = subprocess.Popen(self._command(), stdout=out, stderr=err, env=env,
                                            stdin=subprocess.DEVNULL)
        self._out_path, self._err_path = out_path, err_path
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            with open(out_path, "rb") as f:
                for line in f.read().decode("utf-8", "replace").splitlines():
                    if line.startswith("listening on "):
                        self.address = line[len("listening on "):].strip()
                        self.port = int(self.address.rsplit(":", 1)[1])
                        return self
            if self.process.poll() is not None:
                raise RuntimeError("the coordinator exited with %s before serving:\n%s"
                                   % (self.process.returncode, self.logs()))
            time.sleep(0.02)
        self.kill()
        raise RuntimeError("the coordinator printed no 'listening on' line within %gs:\n%s"
                           % (self.start_timeout, self.logs()))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> Optional[int]:
        """Sends `sig` and waits for the exit (SIGKILL after `timeout`); returns the exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> Optional[int]:
        """SIGKILL (a crash): nothing is flushed or closed."""
        return self.stop(signal.SIGKILL)

    def restart(self) -> "Coordinator":
        """stop() then start() on the same port (the state survives with state_dir)."""
        self.stop()
        return self.start()

    def logs(self) -> str:
        """The current process's stdout and stderr."""
        text = []
        for path in (getattr(self, "_out_path", None), getattr(self, "_err_path", None)):
            if path and os.path.exists(path):
                with open(path, "rb") as f:
                    text.append(f.read().decode("utf-8", "replace"))
        return "\n".join(text)

    def __enter__(self) -> "Coordinator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_log_dir and exc[0] is None:
            shutil.rmtree(self.log_dir, ignore_errors=True)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A one-member etcd 3.4 (Debian's /usr/bin/etcd) on free loopback ports, for replicated coordinators.

        with Etcd() as etcd:
            a = Coordinator(state=etcd.url("/t1"), args=["--lease-ttl", "2s"]).start()
    """

    def __init__(self, binary: str = "/usr/bin/etcd", start_timeout: float = 20.0) -> None:
        self.binary = binary
        self.start_timeout = start_timeout
        self.dir = tempfile.mkdtemp(prefix="shardline-etcd-", dir=os.environ.get("TEST_TMPDIR"))
        self.process: Optional[subprocess.Popen] = None
        self.endpoint = ""

    def url(self, prefix: str) -> str:
        """The coordinator's --state for keys under `prefix` ("/name")."""
        return "etcd://%s%s" % (self.endpoint, prefix)

    def start(self) -> "Etcd":
        import socket
        client, peer = closed_port(), closed_port()
        self.endpoint = "127.0.0.1:%d" % client
        client_url, peer_url = "http://" + self.endpoint, "http://127.0.0.1:%d" % peer
        cmd = [self.binary, "--name=e0", "--data-dir=" + os.path.join(self.dir, "data"),
               "--listen-client-urls=" + client_url, "--advertise-client-urls=" + client_url,
               "--listen-peer-urls=" + peer_url, "--initial-advertise-peer-urls=" + peer_url,
               "--initial-cluster=e0=" + peer_url, "--initial-cluster-state=new",
               "--logger=zap", "--log-outputs=stderr"]
        # etcd reads ETCD_* variables as flags: none may leak in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        self._log = os.path.join(self.dir, "etcd.log")
        with open(self._log, "wb") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=log, env=env,
                                            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("etcd exited with %s:\n%s" % (self.process.returncode,
                                                                  self.logs()))
            try:
                with socket.create_connection(("127.0.0.1", client), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("etcd did not listen on %s within %gs:\n%s"
                           % (self.endpoint, self.start_timeout, self.logs()))

    def logs(self) -> str:
        with open(self._log, "rb") as f:
            return f.read().decode("utf-8", "replace")[-4000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "Etcd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
