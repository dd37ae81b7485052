#!/usr/bin/python3
"""Planning the largest layouts (issue 19, item 4): wall time of `shardctl plan`
for Megatron-LM's 1T configuration (3072 ranks) with --json and as text, and for
GPT-3 175B on 1024 ranks, vs Python's json module writing the same document
(json.dumps(indent=2) of the parsed --json output, in-process, so no process
start: the least a Python planner pays to print this plan). Interface:
bench/README.md."""
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

# name, shardctl plan flags. Megatron-LM's 1T row (Narayanan et al. 2021,
# table 1: 128 layers, hidden 25600, 160 heads, tp 8, pp 64, dp 6 of 3072 GPUs)
# and GPT-3 175B (96 layers, hidden 12288, 96 heads) at tp 8, pp 8, dp 16.
LAYOUTS = [
    ("Megatron 1T", 3072,
     "--layers 128 --hidden 25600 --heads 160 --vocab 51200 --seq 2048 --tp 8 --pp 64 --dp 6"),
    ("GPT-3 175B", 1024,
     "--layers 96 --hidden 12288 --heads 96 --vocab 51200 --seq 2048 --tp 8 --pp 8 --dp 16"),
]
GOAL_S = 0.1  # issue 19: < 100 ms for the 1T layout with --json


def timed(cmd, repeats):
    """Median wall time of `cmd` over `repeats` runs (after one warm-up run), and
    its last stdout."""
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def main():
    quick = benchlib.quick()
    repeats = 3 if quick else 9
    shardctl = os.path.join(benchlib.bench_bin(), "client/shardctl/shardctl")
    rows = benchlib.Rows(benchlib.out_path("bench/out/planner.csv"), "planner")
    for name, ranks, flags in LAYOUTS[:1] if quick else LAYOUTS:
        cmd = [shardctl, "plan"] + flags.split()
        json_s, text = timed(cmd + ["--json"], repeats)
        doc = json.loads(text)
        peer_s = statistics.median(
            benchlib.median_time(lambda: json.dumps(doc, indent=2), 1) for _ in range(repeats))
        note = "%s; %.1f MB of JSON; median of %d; goal < %d ms for the 1T layout" % (
            name, len(text) / 1e6, repeats, GOAL_S * 1000)
        rows.add("shardctl plan --json", "ranks=%d" % ranks, json_s * 1000,
                 "python json.dumps of the same document", peer_s * 1000, "ms", False, note)
        benchlib.log("%s --json: %.1f ms, python json.dumps %.1f ms" % (name, json_s * 1000,
                                                                          peer_s * 1000))
        text_s, summary = timed(cmd, repeats)
        rows.add("shardctl plan (text)", "ranks=%d" % ranks, text_s * 1000,
                 "python json.dumps of the same document", peer_s * 1000, "ms", False,
                 "%s; %d lines of summary" % (name, summary.count(b"\n")))
    benchlib.write_notes(rows.path, """
**How measured.** Wall time of the whole `shardctl plan ... [--json]` process
(start, planning: topology, pipeline schedule, ZeRO units of every (tp, pp, chunk),
memory per rank; writing the output to a pipe), the median of 9 runs after a warm-up
run. Peer: Python's `json.dumps(doc, indent=2)` of the same document, parsed from our
output, timed in-process (no interpreter start): what a planner written in Python pays
for its output alone, before planning anything. The 1T layout is Megatron-LM's largest
row (128 layers, hidden 25600, 160 heads, tp 8 x pp 64 x dp 6 = 3072 ranks; its --json
lists every rank, group, schedule action and ZeRO unit, ~4 MB); the goal is < 100 ms.
""")


if __name__ == "__main__":
    main()
