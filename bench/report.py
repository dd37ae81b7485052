#!/usr/bin/python3
"""Merges bench/out/*.csv (bench/README.md's row format) into docs/benchmarks.csv,
docs/benchmarks.md (machine description, one table per benchmark, notes) and
docs/plots/<benchmark>.png.

  report.py --out-dir bench/out --docs docs [--mode quick|full] [--failed name,...]

A benchmark with no CSV in --out-dir (not run this time: `bench/run.sh --only`
on a fresh checkout, where bench/out/ holds nothing) keeps what the previous
report had: its rows from DOCS/benchmarks.csv and its section of
DOCS/benchmarks.md, table, plots and notes, word for word, marked as carried
over. Only the sections of the benchmarks that ran are regenerated.
"""
import argparse
import csv
import datetime
import glob
import os
import platform
import re
import subprocess
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import goals  # noqa: E402

ORDER = ["collectives", "coordinator_kv", "rendezvous", "heartbeats", "node_loss", "failover",
         "state_backends", "checkpoint", "trainer"]
# A peer cell with no value whose note starts with this prints the note itself
# (what happened instead of a number, e.g. "outcome: job lost ..."), not
# "not measured (...)".
OUTCOME = "outcome: "
PACKAGES = ["python3-torch", "etcd-server", "libgloo-dev", "libopenblas0-pthread", "libisal2",
            "bazel-bootstrap", "g++", "python3-matplotlib"]


def sh(cmd):
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              shell=isinstance(cmd, str)).stdout.strip()
    except OSError:
        return ""


def machine():
    cpu, flags = "?", ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and cpu == "?":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    simd = [x for x in ("avx2", "fma", "avx512f") if x in flags]
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem_kb = int(line.split()[1])
    osname = sh("sed -n 's/^PRETTY_NAME=\"\\(.*\\)\"/\\1/p' /etc/os-release")
    pkgs = []
    for p in PACKAGES:
        v = sh(["dpkg-query", "-W", "-f=${Version}", p])
        pkgs.append("%s %s" % (p, v or "(not installed)"))
    disk = sh("df -h --output=source,fstype,size %s | tail -1" % os.environ.get("BENCH_TMP", "/var/tmp"))
    return OrderedDict([
        ("CPU", "%s, %s logical CPUs (nproc), %s" % (cpu, os.cpu_count(), " ".join(simd))),
        ("Memory", "%.1f GiB" % (mem_kb / 2 ** 20)),
        ("OS / kernel", "%s / Linux %s" % (osname, platform.release())),
        ("Scratch disk", disk),
        ("Packages", ", ".join(pkgs)),
        ("OPENBLAS_CORETYPE", os.environ.get("OPENBLAS_CORETYPE", "(unset)")),
        ("Load average at report time", open("/proc/loadavg").read().split()[:3]),
        ("Commit", sh(["git", "rev-parse", "--short", "HEAD"]) or "?"),
    ])


def tree_commit():
    """HEAD's short hash, with " + local changes" when the tracked files differ."""
    commit = sh(["git", "rev-parse", "--short", "HEAD"]) or "?"
    if sh(["git", "status", "--porcelain", "--untracked-files=no"]):
        commit += " + local changes"
    return commit


def measured_line(out_dir, name, commit):
    """Where a freshly run section's rows come from: when its CSV was written and
    at which commit (tree_commit). Kept word for word when a later report
    carries the section over, so every section says when it was measured."""
    path = os.path.join(out_dir, "%s.csv" % name)
    when = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
    return "*Measured %s, commit %s.*" % (when.strftime("%Y-%m-%d %H:%M UTC"), commit)


def read_rows(out_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(out_dir, "*.csv"))):
        rows.extend(read_csv(path))
    return rows


def read_csv(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            r = csv.DictReader(f)
            if r.fieldnames != benchlib.HEADER:
                print("report: %s has header %s, expected %s; skipped" % (
                    path, r.fieldnames, benchlib.HEADER), file=sys.stderr)
                return []
            rows.extend(r)
    return rows


def previous_sections(md_path):
    """{benchmark: [lines]} of an earlier benchmarks.md: each "## NAME" section up
    to the next "## ", without its trailing blank lines."""
    sections, name = {}, None
    if not os.path.exists(md_path):
        return sections
    with open(md_path) as f:
        for line in f.read().split("\n"):
            if line.startswith("## "):
                name = line[3:].strip()
                sections[name] = []
            elif name is not None:
                sections[name].append(line)
    for lines in sections.values():
        while lines and not lines[-1].strip():
            lines.pop()
    return sections


CARRIED = "Carried over unchanged from the previous report (not run this time): "
CARRIED_MACHINE = "### Machine of the carried-over benchmarks (the previous report)"


def previous_provenance(md_path, sections):
    """Where an earlier benchmarks.md's figures came from, for the benchmarks it
    carries on: {"header": its "Generated by ..." sentence, "machine": [lines of its
    machine table], "carried": set of the names it had itself carried over,
    "carried_header", "carried_machine": the same for those}."""
    out = {"header": "", "machine": [], "carried": set(), "carried_header": "",
           "carried_machine": []}
    if not os.path.exists(md_path):
        return out
    with open(md_path) as f:
        for line in f:
            if line.startswith("Generated by "):
                out["header"] = line.split(" Every figure is", 1)[0].strip()
            elif line.startswith(CARRIED):
                names, _, said = line[len(CARRIED):].partition(". That report said: ")
                out["carried"] = set(re.findall(r"`([^`]+)`", names))
                out["carried_header"] = said.strip().strip('"')
    machine = sections.get("Machine", [])
    if CARRIED_MACHINE[4:] in [x[4:] for x in machine if x.startswith("### ")]:
        i = [x[4:] for x in machine].index(CARRIED_MACHINE[4:])
        out["machine"], out["carried_machine"] = machine[:i], machine[i + 1:]
    else:
        out["machine"] = machine
    for k in ("machine", "carried_machine"):
        while out[k] and not out[k][-1].strip():
            out[k].pop()
    return out


def human_param(p):
    m = re.match(r"^bytes=(\d+)$", p)
    if not m:
        return p
    b = int(m.group(1))
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k and b % (1 << k) == 0:
            return "%d %s" % (b >> k, unit)
    return "%d B" % b


def fmt(v):
    if v == "" or v is None:
        return ""
    x = float(v)
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return "%.0f" % x
    if abs(x) >= 1:
        return "%.2f" % x
    return "%.3g" % x


def param_value(p):
    m = re.match(r"^[^=]+=([-+0-9.eE]+)$", p)
    return float(m.group(1)) if m else None


def table(rows):
    """One line per (case, param); one column per peer: value (ratio)."""
    peers = list(OrderedDict.fromkeys(r["peer"] for r in rows))
    lines = OrderedDict()
    for r in rows:
        lines.setdefault((r["case"], r["param"]), {})[r["peer"]] = r
    unit_of = {k: next(iter(v.values()))["unit"] for k, v in lines.items()}
    out = ["| case | param | Shardline | " + " | ".join(peers) + " |",
           "|---|---|---:|" + "---:|" * len(peers)]
    for (case, param), by_peer in lines.items():
        first = next(iter(by_peer.values()))
        cells = []
        for p in peers:
            r = by_peer.get(p)
            if r is None:
                cells.append("")
            elif r["peer_value"] == "":
                if r["note"].startswith(OUTCOME):
                    cells.append(r["note"][len(OUTCOME):])
                elif not r["note"]:
                    cells.append("—")
                elif not first["shardline"] and r["note"] == first["note"]:
                    # One note explains both: written once, in our cell.
                    cells.append("not measured (see the Shardline cell)")
                else:
                    cells.append("not measured (%s)" % r["note"])
            else:
                c = fmt(r["peer_value"])
                if r["ratio"]:
                    c += " (**%s×**)" % fmt(r["ratio"])
                cells.append(c)
        if first["shardline"]:
            ours = "%s %s" % (fmt(first["shardline"]), unit_of[(case, param)])
        else:
            ours = "not measured (%s)" % first["note"] if first["note"] else "—"
        out.append("| %s | %s | %s | %s |" % (case, human_param(param), ours,
                                               " | ".join(cells)))
    return "\n".join(out)


def plot(name, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r["ratio"]]
    if not rows:
        return False
    cases = list(OrderedDict.fromkeys(r["case"] for r in rows))
    multi = {c: len({r["param"] for r in rows if r["case"] == c}) for c in cases}
    numeric = all(param_value(r["param"]) is not None for r in rows)
    if numeric and max(multi.values()) > 2:
        n = len(cases)
        cols = min(3, n)
        nrows = (n + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
        for i, c in enumerate(cases):
            ax = axes[i // cols][i % cols]
            sub = [r for r in rows if r["case"] == c]
            for peer in OrderedDict.fromkeys(r["peer"] for r in sub):
                pts = sorted((param_value(r["param"]), float(r["ratio"]))
                             for r in sub if r["peer"] == peer)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                        label="vs " + peer)
            xs = [param_value(r["param"]) for r in sub]
            if min(xs) > 0 and max(xs) / min(xs) > 100:
                ax.set_xscale("log", base=2 if sub[0]["param"].startswith("bytes=") else 10)
            ys = [float(r["ratio"]) for r in sub]
            if min(ys) > 0 and max(ys) / min(ys) > 20:
                ax.set_yscale("log")
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_title(c, fontsize=10)
            ax.set_xlabel(sub[0]["param"].split("=")[0])
            ax.set_ylabel("Shardline / peer (%s)" % sub[0]["unit"])
            ax.legend(fontsize=7)
        for j in range(n, nrows * cols):
            axes[j // cols][j % cols].axis("off")
    else:
        labels = ["%s\n%s" % (r["case"], human_param(r["param"])) for r in rows]
        groups = list(OrderedDict.fromkeys(labels))
        peers = list(OrderedDict.fromkeys(r["peer"] for r in rows))
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
        w = 0.8 / len(peers)
        for k, peer in enumerate(peers):
            xs, ys = [], []
            for r, lab in zip(rows, labels):
                if r["peer"] == peer:
                    xs.append(groups.index(lab) + k * w - 0.4 + w / 2)
                    ys.append(float(r["ratio"]))
            ax.bar(xs, ys, width=w, label="vs " + peer)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, fontsize=8)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_ylabel("Shardline / peer")
        ax.legend(fontsize=8)
    fig.suptitle("%s: Shardline / peer (above 1 = Shardline higher)" % name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_values(name, rows, path):
    """Line plots of the values themselves (Shardline and every peer), log-log, for
    benchmarks swept over a numeric parameter (e.g. bandwidth against size)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r["shardline"] and param_value(r["param"]) is not None]
    cases = list(OrderedDict.fromkeys(r["case"] for r in rows))
    if not cases or max(len({r["param"] for r in rows if r["case"] == c}) for c in cases) <= 2:
        return False
    cols = min(3, len(cases))
    nrows = (len(cases) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    for i, c in enumerate(cases):
        ax = axes[i // cols][i % cols]
        sub = [r for r in rows if r["case"] == c]
        ours = sorted({(param_value(r["param"]), float(r["shardline"])) for r in sub})
        ax.plot([p[0] for p in ours], [p[1] for p in ours], marker="o", ms=3, lw=2,
                label="Shardline", color="black")
        for peer in OrderedDict.fromkeys(r["peer"] for r in sub):
            pts = sorted((param_value(r["param"]), float(r["peer_value"]))
                         for r in sub if r["peer"] == peer and r["peer_value"])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=peer)
        ax.set_xscale("log", base=2 if sub[0]["param"].startswith("bytes=") else 10)
        ax.set_yscale("log")
        ax.set_title(c, fontsize=10)
        ax.set_xlabel(sub[0]["param"].split("=")[0])
        ax.set_ylabel(sub[0]["unit"])
        ax.legend(fontsize=7)
    for j in range(len(cases), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle("%s: measured values" % name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default="bench/out")
    ap.add_argument("--docs", default="docs")
    ap.add_argument("--mode", default="full")
    ap.add_argument("--failed", default="")
    ap.add_argument("--elapsed", default="")
    ap.add_argument("--only", default="", help="bench/run.sh's --only, named in the header")
    a = ap.parse_args()
    rows = read_rows(a.out_dir)
    # With --only, what bench/out/ holds from earlier runs is not this run's:
    # those sections are carried over from the previous report like any other.
    if a.only:
        only = set(a.only.split(","))
        rows = [r for r in rows if r["benchmark"] in only]
    ran = set(r["benchmark"] for r in rows)
    # Benchmarks not run this time keep the previous report's rows and section.
    md_path = os.path.join(a.docs, "benchmarks.md")
    old_sections = previous_sections(md_path)
    prov = previous_provenance(md_path, old_sections)
    carried = [r for r in read_csv(os.path.join(a.docs, "benchmarks.csv"))
               if r["benchmark"] not in ran and r["benchmark"] in old_sections]
    carried_names = set(r["benchmark"] for r in carried)
    rows = rows + carried
    # The order of a full run's CSV (bench/out/*.csv by file name).
    rows.sort(key=lambda r: r["benchmark"])
    os.makedirs(os.path.join(a.docs, "plots"), exist_ok=True)
    with open(os.path.join(a.docs, "benchmarks.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=benchlib.HEADER)
        w.writeheader()
        w.writerows(rows)
    names = list(OrderedDict.fromkeys(r["benchmark"] for r in rows))
    names.sort(key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = ["# Benchmarks", "",
          "Generated by `bench/run.sh%s` on %s%s. Every figure is a ratio against a peer "
          "measured in the same run: **ratio = Shardline / peer**; for throughput "
          "(GB/s, ops/s, tokens/s) above 1 means Shardline is faster, for latency and time "
          "(ms, s) below 1 does. How each benchmark measures and its caveats are under its "
          "table; the row format and how to add a benchmark are in `bench/README.md`. "
          "Raw rows: [`benchmarks.csv`](benchmarks.csv)."
          % ((" --quick" if a.mode == "quick" else "") +
             (" --only %s" % a.only if a.only else ""), now,
             " in %s" % a.elapsed if a.elapsed else ""), ""]
    # What the carried benchmarks were measured under: the previous report's own
    # header and machine, or, when it had carried them all itself, what it quoted.
    old_header, old_machine = prov["header"], prov["machine"]
    if carried_names and carried_names <= prov["carried"]:
        old_header, old_machine = prov["carried_header"], prov["carried_machine"]
    if carried_names:
        md += [CARRIED + "%s. %s" % (
            ", ".join("`%s`" % n for n in names if n in carried_names),
            "That report said: \"%s\"" % old_header if old_header else ""), ""]
    if a.mode != "quick":
        md += goals.section(rows)
    if a.mode == "quick":
        md += ["> **Quick mode**: small sizes and few iterations; the figures show that the "
               "harness works, not how fast anything is.", ""]
    md += ["## Machine", "", "| | |", "|---|---|"]
    for k, v in machine().items():
        md.append("| %s | %s |" % (k, " ".join(v) if isinstance(v, list) else v))
    md.append("")
    if carried_names and old_machine:
        md += [CARRIED_MACHINE] + old_machine + [""]
    commit = tree_commit()
    for n in names:
        if n in carried_names:
            md += ["## %s" % n] + old_sections[n] + [""]
            continue
        sub = [r for r in rows if r["benchmark"] == n]
        md += ["## %s" % n, "", measured_line(a.out_dir, n, commit), "", table(sub), ""]
        png = os.path.join(a.docs, "plots", "%s.png" % n)
        try:
            if plot(n, sub, png):
                md += ["![%s](plots/%s.png)" % (n, n), ""]
            if plot_values(n, sub, os.path.join(a.docs, "plots", "%s_values.png" % n)):
                md += ["![%s, values](plots/%s_values.png)" % (n, n), ""]
        except Exception as e:  # a plot is not worth losing the report over
            print("report: plot %s failed: %s" % (n, e), file=sys.stderr)
        notes = os.path.join(a.out_dir, "%s.md" % n)
        if os.path.exists(notes):
            md += [open(notes).read().strip(), ""]
    failed = [x for x in a.failed.split(",") if x]
    if failed:
        md += ["## Not run to completion", "",
               "These benchmarks failed in this run (their rows, if any, are above): " +
               ", ".join("`%s`" % x for x in failed) + ".", ""]
    with open(os.path.join(a.docs, "benchmarks.md"), "w") as f:
        f.write("\n".join(md))
    print("report: %d rows from %d benchmarks -> %s/benchmarks.{md,csv}, %s/plots/" % (
        len(rows), len(names), a.docs, a.docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
