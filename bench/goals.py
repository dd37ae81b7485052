"""The speed goals the benchmarks are held to (the project's speed issue: a
trainer faster than torch on the CPU, shared-memory collectives, a coordinator
at fleet scale, the planner, checkpoints), checked against a report's rows.

report.py puts `section(rows)` at the top of docs/benchmarks.md: one line per
goal with the figure this run measured, met or missed, and for a missed goal
the reason (WHY, written by hand from the measurements and profiles quoted in
the benchmark's own notes below; shown only while the goal is missed).

A goal is one of
  ratio:  every matching row's ratio (Shardline / peer, benchlib.HEADER) is at
          least `target` (throughputs) or at most it (times); the worst row
          is shown;
  value:  Shardline's own figure is at most `target` (seconds, ms); a row
          that was not measured misses it.
"""


class Goal:
    def __init__(self, key, text, benchmark, kind, target, cases, params=None, peer=None):
        self.key = key            # WHY's key
        self.text = text          # the goal as the issue states it
        self.benchmark = benchmark
        self.kind = kind          # "ratio" or "value"
        self.target = target
        self.cases = cases        # row cases that count
        self.params = params      # row params that count (None: all)
        self.peer = peer          # peer name prefix (ratio goals)


MIB64 = "bytes=67108864"
GOALS = [
    Goal("trainer-1", "trainer, 1 process 1 thread >= 1.2x torch (1.13 and 2.x)", "trainer",
         "ratio", 1.2, ["1 process 1 thread"], peer="torch"),
    Goal("trainer-2", "trainer, 1 process 2 threads >= 1.2x torch (1.13 and 2.x)", "trainer",
         "ratio", 1.2, ["1 process 2 threads"], peer="torch"),
    Goal("trainer-dp", "trainer, dp=2 >= 1.0x torch DDP over gloo (1.13 and 2.x)", "trainer",
         "ratio", 1.0, ["dp=2 (1 thread per rank)"], peer="torch"),
]
for _op in ["all_reduce", "all_gather", "reduce_scatter"]:
    for _n in [2, 4]:
        _case = "%s %d ranks" % (_op, _n)
        GOALS.append(Goal("coll-64", "%s: >= 3x raw Gloo bus bandwidth at 64 MiB" % _case,
                          "collectives", "ratio", 3.0, [_case], [MIB64], "gloo direct"))
        GOALS.append(Goal("coll-all", "%s: >= 1.0x raw Gloo at every size" % _case,
                          "collectives", "ratio", 1.0, [_case], None, "gloo direct"))
GOALS += [
    Goal("rdv-4096", "4096 workers hold assignments in <= 2 s", "rendezvous", "value", 2.0,
         ["all workers hold assignments"], ["workers=4096"]),
    Goal("rdv-100k", "100,000 simulated workers hold assignments in < 60 s", "rendezvous",
         "value", 60.0, ["all workers hold assignments"], ["workers=100000"]),
    Goal("hb-closed", "heartbeats closed loop at 4096 workers >= 1.0x etcd", "heartbeats",
         "ratio", 1.0, ["heartbeats/s closed loop (capacity)"], ["workers=4096"], "etcd"),
    Goal("hb-paced", "heartbeat p99 paced (every 1 s) at 4096 workers <= 50 ms", "heartbeats",
         "value", 50.0, ["heartbeat latency p99 paced every 1000 ms"], ["workers=4096"]),
    Goal("barrier", "barrier rounds >= 1.0x TCPStore add+wait, every client count",
         "coordinator_kv", "ratio", 1.0, ["barrier rounds"], None, "torch"),
    Goal("planner", "shardctl plan --json, Megatron 1T (3072 ranks) < 100 ms", "planner",
         "value", 100.0, ["shardctl plan --json"], ["ranks=3072"]),
    Goal("ckpt-save", "checkpoint save >= 0.95x dd", "checkpoint", "ratio", 0.95, ["save"],
         None, "dd"),
    Goal("ckpt-restore", "checkpoint restore >= 0.95x dd", "checkpoint", "ratio", 0.95,
         ["restore"], None, "dd"),
]

# Why a goal is missed, by key: shown only for a missed goal.
WHY = {
    "coll-64": (
        "At 64 MiB the buffers are far larger than the caches, so the collective runs at the "
        "speed of this 2-core VM's memory, which all ranks share: one thread copies 64 MiB at "
        "the rate of the memcpy column, and Shardline's bus bandwidth is already 0.25-0.8x "
        "of that. The shared-memory algorithm moves each byte as few times as a staging "
        "buffer allows (a peer's piece is copied into the segment once and read out once; "
        "the reduction reads it there), so what is left is fewer copies: ranks whose tensors "
        "are themselves in shared memory (a registered buffer pool, as NCCL's user-buffer "
        "registration), read by peers in place. Not built. Gloo's TCP path costs two kernel "
        "copies per byte plus its stack, so the ratio is high where TCP is slow for its size "
        "and lower where Gloo's own copies stream well. These rows also move a lot between "
        "runs on this machine (64 MiB is timed over 3 calls): in two runs 20 minutes apart "
        "on 2026-12-06, all_reduce 2 ranks went 3.66x -> 2.68x and reduce_scatter 4 ranks "
        "2.45x -> 3.42x. all_reduce 2 ranks and reduce_scatter at 2 and 4 ranks have been "
        "above 3x in one run and below it in another; all_gather (1.5-2.9x in three full "
        "runs) and all_reduce at 4 ranks (2.1-2.8x) have stayed below."),
    "trainer-1": (
        "Run-to-run variance on this machine, not a slower trainer: the full run an hour "
        "earlier (before the fused bias+GELU) measured 1.29x against torch 2.15 at 1 thread, "
        "this rerun 1.16x (Shardline 13.4k tokens/s, torch 2.15 11.6k). "
        "The two trainer binaries alternating right after this run, 3 runs each of 40 steps "
        "at 1 thread: before the change 12.2k, 13.7k, 11.6k tokens/s, after 13.6k, 13.3k, "
        "13.0k. The goal is met in one run and missed in the next; the margin is too thin "
        "for this machine's noise."),
    "rdv-4096": (
        "The coordinator and the load generator (4096 gRPC connections and their threads) "
        "share this machine's 2 cores. perf on the coordinator while 4096 workers form: "
        "libgrpc 37 %, the kernel 29 %, malloc/free 15 %, Shardline's own code 7.6 %; "
        "tcmalloc and jemalloc made no difference beyond noise. Five runs on their own "
        "measured 1.69-2.59 s, the last two full runs 3.21 and 3.46 s, a rendezvous-only "
        "run 2.59 s: the goal is met "
        "only on a good run, and nothing of Shardline's own is "
        "left to cut. From 2048 to 4096 workers the time grows faster than N: each event of "
        "Debian's gRPC costs O(open calls) (see the 100,000 row)."),
    "rdv-100k": (
        "Debian's libgrpc 1.51 is built without NDEBUG: every completion scans the "
        "completion queue's outstanding operations and every timer walks a debug hash of "
        "all live timers, so with one open Session stream and one waiting GetAssignment per "
        "worker each event costs O(workers) and forming N workers O(N^2) (the rendezvous "
        "notes: perf with uprobes). The coordinator's own work stays small (generation 1 "
        "formed, world 100000, 15.6 s after the first JoinJob), but delivering the "
        "assignments and answering the fleet's heartbeats does not finish. A gRPC built "
        "with NDEBUG removes both scans; the product uses Debian's packages."),
    "barrier": (
        "Each Barrier is one gRPC call held until the last member arrives, and one gRPC "
        "call here costs more than a TCPStore round: at 1 client Shardline's KV set+get took "
        "87-117 us per call in today's runs, torch 1.13's TCPStore 26-29 us; TCPStore's "
        "2-member add+wait barrier measured 2.1k, 15.2k and 12.5k rounds/s in three runs on "
        "this machine, Shardline's 3.5k-4.2k. perf on the coordinator under that load: the kernel "
        "36 %, libgrpc 32 %, Shardline's own code 5.7 % (coordinator_kv's notes). The "
        "barrier logic is not where the time goes; a TCPStore-class figure needs a leaner "
        "transport for the store and barriers beside gRPC (a plain framed protocol, "
        "authenticated like the RPCs), which is not built."),
    "ckpt-restore": (
        "Restore reads the shard with pread in 4 MiB chunks on up to 4 threads and verifies "
        "the CRC-32C of every byte as it arrives, into the state's own memory; dd reads "
        "sequentially into one 4 MiB buffer and throws it away. Today's three runs measured "
        "0.96x, 0.96x and 0.92x (the median of the per-repeat ratios 0.90-0.94; single "
        "repeats 0.69-1.62, on a virtual disk the host may cache): the goal lies inside "
        "this machine's run-to-run spread. Larger or direct reads were not tried this "
        "session."),
    "hb-closed": (
        "Both servers answer what one load generator on the same 2 cores can send: 0.99x "
        "here, 1.02x in the previous full run, 1.05x at 1024 workers and 1.27x at 256 in "
        "that run; the difference is within this machine's run-to-run noise."),
}


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def check(goal, rows):
    """(shown figure, met, detail): met is None when no row matched."""
    mine = [r for r in rows if r["benchmark"] == goal.benchmark and r["case"] in goal.cases
            and (goal.params is None or r["param"] in goal.params)
            and (goal.peer is None or r["peer"].startswith(goal.peer))]
    if not mine:
        return "no row", None, ""
    if goal.kind == "value":
        r = mine[0]
        v = _num(r["shardline"])
        if v is None:
            return "not measured", False, r["note"]
        return "%.3g %s" % (v, r["unit"]), v <= goal.target, ""
    higher = mine[0]["higher_is_better"] == "1"
    measured = [(r, _num(r["ratio"])) for r in mine]
    unmeasured = [r for r, x in measured if x is None]
    measured = [(r, x) for r, x in measured if x is not None]
    if not measured:
        return "not measured", False, unmeasured[0]["note"]
    worst_row, worst = (min if higher else max)(measured, key=lambda p: p[1])
    met = (worst >= goal.target) if higher else (worst <= goal.target)
    params = set(r["param"] for r, _ in measured)
    where = " (worst: %s)" % worst_row["param"] if len(params) > 1 else ""
    return "%.2fx vs %s%s" % (worst, worst_row["peer"], where), met, ""


def section(rows):
    """Markdown lines: the goals table, then why each missed goal is missed."""
    out = ["## Goals", "",
           "The speed goals against this run's rows (bench/goals.py); the worst row counts "
           "where a goal covers several.", "",
           "| goal | this run | met |", "|---|---|---|"]
    missed = []
    for g in GOALS:
        shown, met, detail = check(g, rows)
        mark = {True: "yes", False: "**no**", None: "not run"}[met]
        out.append("| %s | %s | %s |" % (g.text, shown, mark))
        if met is False:
            missed.append((g, detail))
    out.append("")
    by_key = {}
    for g, detail in missed:
        by_key.setdefault(g.key, []).append(g.text)
    for key, texts in by_key.items():
        out += ["**Missed: %s.** %s" % ("; ".join(texts),
                                         WHY.get(key, "(no reason written down yet)")), ""]
    return out
