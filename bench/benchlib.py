"""Helpers shared by the benchmark scripts (see bench/README.md for the interface)."""
import csv
import functools
import os
import statistics
import subprocess
import sys
import time

HEADER = ["benchmark", "case", "param", "shardline", "peer", "peer_value", "ratio", "unit",
          "higher_is_better", "note"]


def quick():
    return os.environ.get("BENCH_QUICK", "0") == "1" or "--quick" in sys.argv


def out_path(default):
    """The --out argument, or `default`."""
    argv = sys.argv
    for i, a in enumerate(argv):
        if a == "--out" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--out="):
            return a.split("=", 1)[1]
    return default


def bench_bin():
    return os.environ.get("BENCH_BIN", "bazel-bin")


def bench_tmp():
    d = os.environ.get("BENCH_TMP", "/var/tmp/shardline-bench")
    os.makedirs(d, exist_ok=True)
    return d


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def _num(x):
    if x is None:
        return ""
    if isinstance(x, float):
        return "%.6g" % x
    return str(x)


class Rows:
    """Collects rows and writes them to `path` (rewritten after every add, so a
    benchmark that dies halfway leaves what it measured)."""

    def __init__(self, path, benchmark):
        self.path = path
        self.benchmark = benchmark
        self.rows = []
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._flush()

    def add(self, case, param, shardline, peer, peer_value, unit, higher_is_better=True, note=""):
        ratio = None
        if shardline is not None and peer_value not in (None, 0):
            ratio = shardline / peer_value
        self.rows.append([self.benchmark, case, param, _num(shardline), peer, _num(peer_value),
                          _num(ratio), unit, "1" if higher_is_better else "0", note])
        self._flush()

    def _flush(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(HEADER)
            w.writerows(self.rows)
        os.replace(tmp, self.path)


def write_notes(csv_path, text):
    """Writes bench/out/<name>.md beside the CSV: notes printed under the table."""
    base = os.path.splitext(csv_path)[0]
    with open(base + ".md", "w") as f:
        f.write(text.strip() + "\n")


def median_time(fn, repeats):
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


DEBIAN_PYTHON = "/usr/bin/python3"


@functools.lru_cache(maxsize=None)
def torch_version(python):
    """torch's version under `python` ("1.13.1", "2.15.0+cu130"), or None."""
    try:
        r = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def torch_peers():
    """The torch installations to measure as peers, as [(label, python)]:
    Debian's torch 1.13 (/usr/bin/python3) and current torch from PyPI in the
    virtualenv deploy/install_deps.sh --bench makes ($SHARDLINE_BENCH_VENV,
    default ~/.cache/shardline-bench-venv) when it is there. label is
    "torch 1.13", "torch 2.15", ... (major.minor)."""
    venv = os.environ.get("SHARDLINE_BENCH_VENV",
                          os.path.expanduser("~/.cache/shardline-bench-venv"))
    peers = []
    for python in (DEBIAN_PYTHON, os.path.join(venv, "bin", "python")):
        version = torch_version(python) if os.path.exists(python) else None
        if version is None:
            continue
        peers.append(("torch " + ".".join(version.split("+")[0].split(".")[:2]), python))
    return peers
