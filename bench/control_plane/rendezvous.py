#!/usr/bin/python3
"""Benchmark `rendezvous` (bench/README.md, item 3): the time from the first
JoinJob until N simulated workers (64..100000) all hold their assignments,
against torchrun's c10d rendezvous (torch 1.13) of N nodes over a TCPStore.

    bench/control_plane/rendezvous.py --out bench/out/rendezvous.csv [--quick]
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import benchlib  # noqa: E402

NAME = "rendezvous"


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/%s.csv" % NAME)
    rows = benchlib.Rows(out, NAME)
    sizes = [64, 256] if quick else [64, 128, 256, 1024, 2048, 4096, 16384, 32768, 100000]
    # Up to this size every simulated worker has its own connection, in one
    # cp_load process; above it SHARED_PROCESSES processes share
    # SHARED_CONNECTIONS connections each (this machine's fd limit of 20000
    # and its 28k loopback ports to one address could not hold 100k).
    own_max = 4096
    shared_processes, shared_connections = 4, 1024
    # torch's rendezvous rewrites one pickled state with every participant
    # (O(N) per join): past this size it does not finish in a benchmark's time.
    torch_max = 64 if quick else 128
    torch_timeout = 30 if quick else 60
    # Past this the answer is already "does not form on this machine".
    shardline_timeout = 60
    torch_peers = benchlib.torch_peers()
    for n in sizes:
        timeout_s = shardline_timeout if n <= own_max else 4 * shardline_timeout
        extra = {} if n <= own_max else {"processes": shared_processes,
                                         "connections": shared_connections}
        benchlib.log("%s: %d workers" % (NAME, n))
        sl, note = None, ""
        coord = _common.Coordinator("rendezvous-coordinator-%d" % n)
        try:
            sl = _common.cp_load("rendezvous", address=coord.address, workers=n,
                                 timeout_s=timeout_s, timeout=timeout_s + 120, **extra)
            if extra:
                note = "%d cp_load processes; %d workers share each of %d connections" % (
                    sl["processes"], -(-n // sl["connections"]), sl["connections"])
            if sl["interval_ms"] != 5000:
                note += "; heartbeat_interval %g s (N/5000 s)" % (sl["interval_ms"] / 1000.0)
            if sl["assigned"] != n:
                note = "shardline: %d of %d assigned within %d s (%d failed: %s)" % (
                    sl["assigned"], n, timeout_s, sl["failed"],
                    sl["first_error"][:100].replace(",", ";"))
                sl = None
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            benchlib.log("  shardline failed: %s" % e)
            note = "shardline failed: %s" % str(e).splitlines()[0][:150]
        finally:
            coord.stop()
        # Each torch the machine has (Debian's 1.13, PyPI's current one).
        for label, python in torch_peers:
            peer, extra = None, ""
            if n <= torch_max:
                store = _common.TorchStore("rendezvous-tcpstore-%s-%d" % (label.replace(" ", ""), n),
                                           python)
                try:
                    pr = _common.run_json(
                        [python, os.path.join(_common.HERE, "_torch_rendezvous.py"),
                         "--port", str(store.port), "--nodes", str(n),
                         "--timeout-s", str(torch_timeout)], timeout=torch_timeout + 120)
                    if pr["done"] == n:
                        peer = pr["seconds"]
                    else:
                        extra = " %s: %d of %d nodes done in %d s (%s)" % (
                            label, pr["done"], n, torch_timeout, pr["first_error"][:80])
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    benchlib.log("  %s failed: %s" % (label, e))
                    extra = " %s failed: %s" % (label, str(e).splitlines()[0][:150])
                finally:
                    store.stop()
            else:
                extra = (" torch c10d not run above %d nodes (here 128 nodes took 8 s and 256 did"
                         " not finish in 60 s: every join rewrites its whole pickled state)"
                         % torch_max)
            rows.add("all workers hold assignments", "workers=%d" % n,
                     sl["seconds"] if sl else None, "%s c10d rendezvous" % label, peer, "s",
                     False, (note + extra).strip())
    benchlib.write_notes(out, """
**How measured.** A fresh `shardline-coordinator --state memory` per size; one job with
`min_workers = max_workers = N` (tp = pp = 1, dp = N). The load generator (`cp_load rendezvous`) starts N
simulated workers at once, each with its own gRPC connection, each doing what `shardline-worker` does: `JoinJob`,
open the `Session` stream, wait for `SessionOpened`, `GetAssignment(wait)`. The time runs from the first
`JoinJob` to the last worker holding its assignment. Each assignment carries only the process groups of its
rank, in the compact form the simulated workers ask for (`JoinJobRequest.compact_groups`: first rank, stride
and size instead of N ranks at dp = N); `JoinJob`, `GetAssignment` and the Session streams run on gRPC's
callback API (no thread per waiting worker). Up to 4096 workers every simulated worker has its own gRPC
channel and TCP connection in one cp_load process; above that 4 cp_load processes each share 1024
connections among their workers (the note says how many per connection), which real workers, one process
each, would not: this machine allows 20000 open files per process and ~28k loopback ports to one address.
Every simulated worker heartbeats from its `JoinJob` on, every `heartbeat_interval` = max(5 s, N/5000 s)
(`heartbeat_timeout` 6 intervals): the interval grows past 25000 workers so that the fleet offers at most
5000 heartbeats/s while it forms, as a deployment of that size would be configured (the heartbeats table shows
what one coordinator answers here; at 100000 workers and 5 s the fleet offered 20000/s while forming, the
coordinator fell behind and declared workers LOST by heartbeat timeout). Sizes up to 4096 must form within %d s, larger ones within four times that; a size that does not is
reported as not measured, with how many workers got their assignment and the first error. Peer: torchrun's c10d rendezvous
(`DynamicRendezvousHandler` + `C10dRendezvousBackend`, min = max nodes = N) over a TCPStore, of Debian's torch 1.13
and of current torch from PyPI where its virtualenv exists (each column names its version), N nodes as threads of
one process, each with its own TCPStore connection; it polls its shared state once a second, and each join rewrites the whole pickled state, so
it is run up to %d nodes only. torchrun has one node per *machine* (agent), Shardline one worker per *rank*: at
8 GPUs a node, N Shardline workers correspond to N/8 torch nodes.

**Where the time goes past 16k workers (measured 2026-12-06, perf with uprobes on Debian's libgrpc29 1.51.1).**
Debian builds libgrpc without `NDEBUG`, which leaves two debug structures on every event: each completion queue
keeps its outstanding operations in an array and scans it, under the queue's lock, at every completion (gRPC's
`cq_check_tag`), and every timer add or cancel walks a chain of a 1009-bucket debug hash of all live timers. A
distribution build serves every callback-API call of a process from one process-wide queue
(`CallbackAlternativeCQ`), and each open call keeps an operation there: every worker's Session stream, every
waiting `GetAssignment`. So each event costs O(open calls) and forming N workers O(N^2): at 16384 workers the
coordinator's queue saw 186,883 completions with 9,538 operations outstanding on average; at 32768 that scan was 31%%
of the coordinator's CPU. The coordinator's own work stays small: at 100000 workers its log shows generation 1
formed (world 100000) 15.6 s after the first `JoinJob`; what does not finish is delivering the assignments and
answering 5000 heartbeats/s at O(N) per completion, until a heartbeat waits past its 2 min timeout, the
generation ends and the job re-forms. The load generator had the same cost on its side (one queue per process
for 25000 workers); it now has a queue, served by two threads, per 4096 workers. Tried on the coordinator and
not kept:
8 gRPC servers sharing the port (SO_REUSEPORT): no change, the callback queue is process-wide; the Session
stream on gRPC's asynchronous API over 8 queues of its own: the scan is divided, but 65536 workers took 64-123 s
instead of 42 s (more completions and timer operations, whose cause the library's missing symbols hide); taking
the assignment from the Session stream's push instead of a waiting `GetAssignment`: 34 s instead of 42 s at
65536, no change at 4096. A gRPC built with `NDEBUG` removes both costs; the product uses Debian's.
""" % (shardline_timeout, torch_max))
    return 0


if __name__ == "__main__":
    sys.exit(main())
