#!/usr/bin/env python3
"""Where a pod start's time goes: rustlet's startup trace laid over the
workload's own times.

    hack/startup-trace.py LOG RECORD.json... [--json FILE]
    hack/startup-trace.py selftest

LOG is rustlet's log with the startup trace on
(`RUST_LOG=info,rustlet::startup=debug`, src/startup_trace.rs: one line per
stage, `pod=<namespace>/<name> stage=<stage>`, status patches with
`phase=`). Each RECORD is one of bench/pod_start.rs's JSON records (single,
burst or steady), which names each pod, when its create was sent (a burst's
pods: the burst's start) and when the workload saw it Running, UNIX
seconds. The pods are in the `default` namespace.

For each record, prints one table: each stage's first mark per pod, taken
after the pod's create, as milliseconds from the create (median and largest
over the pods), and the median of each pod's time from the stage it passed just before
(in that pod's own order); the table is in the stages' median order. The rows are
the trace's stages, `status_sent Running` (the first status patch with
phase Running) and `seen Running by the workload`. --json writes the same
figures, by record mode.
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from datetime import datetime

LINE = re.compile(r"^(\S+)\s+DEBUG\s.*?rustlet::startup: startup (.*)$")
FIELD = re.compile(r"(\w+)=(\S*)")
WORKLOAD_SEEN = "seen Running by the workload"
STATUS_RUNNING = "status_sent Running"
# The stages in the order a first start passes them (ties in the table).
STAGES = ["watched", "admitted", "volumes_ready", "sandbox_ready", "image_ready", "container_created",
          "container_started", "status_sent", STATUS_RUNNING, "running_seen", WORKLOAD_SEEN]


def unix(stamp):
    """An RFC 3339 timestamp of the log (`2026-12-07T19:30:31.166243Z`) as
    UNIX seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def read_trace(lines):
    """{pod key: [(unix seconds, stage)]}, in the log's order; a status
    patch with phase Running also counts as STATUS_RUNNING."""
    marks = defaultdict(list)
    for line in lines:
        m = LINE.match(line.rstrip("\n"))
        if not m:
            continue
        fields = dict(FIELD.findall(m.group(2)))
        pod, stage = fields.get("pod"), fields.get("stage")
        if not pod or not stage:
            continue
        try:
            t = unix(m.group(1))
        except ValueError:
            continue
        marks[pod].append((t, stage))
        if stage == "status_sent" and fields.get("phase") == "Running":
            marks[pod].append((t, STATUS_RUNNING))
    return marks


def stages_of(record, marks, namespace="default"):
    """{stage: [ms from create, one per pod that has it]} and {stage: [ms
    from the stage before, per pod]} for one record, the order of the stages
    by median."""
    per_pod = []
    for p in record.get("pods") or []:
        created, first = p["created"], {}
        for t, stage in marks.get(f"{namespace}/{p['name']}", []):
            if t >= created and stage not in first:
                first[stage] = (t - created) * 1000
        first[WORKLOAD_SEEN] = (p["running"] - created) * 1000
        per_pod.append(first)
    offsets = defaultdict(list)
    for first in per_pod:
        for stage, ms in first.items():
            offsets[stage].append(ms)
    rank = {s: i for i, s in enumerate(STAGES)}
    order = sorted(offsets, key=lambda s: (statistics.median(offsets[s]), rank.get(s, len(STAGES)), s))
    steps = defaultdict(list)
    for first in per_pod:
        before = 0.0
        for stage in sorted(first, key=lambda s: (first[s], rank.get(s, len(STAGES)))):
            steps[stage].append(first[stage] - before)
            before = first[stage]
    return order, offsets, steps


def summary(record, marks):
    """The figures of one record: a list of rows, in stage order."""
    order, offsets, steps = stages_of(record, marks)
    return [
        {
            "stage": s,
            "pods": len(offsets[s]),
            "median_ms": round(statistics.median(offsets[s]), 1),
            "max_ms": round(max(offsets[s]), 1),
            "step_median_ms": round(statistics.median(steps[s]), 1),
        }
        for s in order
    ]


def table(mode, count, rows):
    out = [f"startup trace, {mode} ({count} pods): ms from the create",
           f"  {'stage':<30} {'pods':>5} {'median':>9} {'max':>9} {'step':>9}"]
    for r in rows:
        out.append(f"  {r['stage']:<30} {r['pods']:>5} {r['median_ms']:>9.1f} {r['max_ms']:>9.1f} "
                   f"{r['step_median_ms']:>9.1f}")
    return "\n".join(out)


def selftest():
    log = [
        "2026-12-07T10:00:00.050000Z DEBUG rustlet::startup: startup pod=default/a stage=watched",
        "2026-12-07T10:00:00.060000Z DEBUG reconcile{pod=default/a}: rustlet::startup: startup pod=default/a stage=admitted",
        "2026-12-07T10:00:00.160000Z DEBUG reconcile{pod=default/a}: rustlet::startup: startup pod=default/a stage=sandbox_ready",
        "2026-12-07T10:00:00.170000Z DEBUG reconcile{pod=default/a}: rustlet::startup: startup pod=default/a stage=status_sent phase=Pending",
        "2026-12-07T10:00:00.200000Z DEBUG reconcile{pod=default/a}: rustlet::startup: startup pod=default/a stage=status_sent phase=Running",
        "2026-12-07T10:00:00.210000Z DEBUG rustlet::startup: startup pod=default/a stage=watched",
        "2026-12-07T10:00:00.070000Z DEBUG rustlet::startup: startup pod=default/b stage=watched",
        "2026-12-07T10:00:00.370000Z DEBUG reconcile{pod=default/b}: rustlet::startup: startup pod=default/b stage=sandbox_ready",
        "2026-12-07T10:00:00.390000Z  INFO rustlet::pod: something else pod=default/b stage=x",
        "garbage",
    ]
    t0 = unix("2026-12-07T10:00:00Z")
    record = {"mode": "burst", "count": 2, "pods": [
        {"name": "a", "created": t0, "running": t0 + 0.25},
        {"name": "b", "created": t0, "running": t0 + 0.45},
    ]}
    marks = read_trace(log)
    assert len(marks["default/a"]) == 7, marks["default/a"]
    assert len(marks["default/b"]) == 2, marks["default/b"]
    rows = {r["stage"]: r for r in summary(record, marks)}
    # The first mark of each stage counts; a pod without a stage is left out.
    assert rows["watched"] == {"stage": "watched", "pods": 2, "median_ms": 60.0, "max_ms": 70.0,
                               "step_median_ms": 60.0}, rows["watched"]
    assert rows["admitted"]["pods"] == 1 and rows["admitted"]["median_ms"] == 60.0
    assert rows["sandbox_ready"]["median_ms"] == 265.0 and rows["sandbox_ready"]["max_ms"] == 370.0
    assert rows[STATUS_RUNNING]["median_ms"] == 200.0
    assert rows[WORKLOAD_SEEN]["median_ms"] == 350.0
    # Steps: each pod's time from the stage before it in the table's order.
    assert rows["sandbox_ready"]["step_median_ms"] == 200.0, rows["sandbox_ready"]
    # A mark before the create (another pod of the same name) is not taken.
    early = {"mode": "single", "count": 1,
             "pods": [{"name": "a", "created": t0 + 0.1, "running": t0 + 0.3}]}
    rows = {r["stage"]: r for r in summary(early, marks)}
    assert "watched" in rows and rows["watched"]["median_ms"] > 100, rows
    assert "admitted" not in rows
    print(table("burst", 2, summary(record, marks)))
    print("startup-trace.py selftest: ok")


def main(argv):
    if argv[1:] == ["selftest"]:
        selftest()
        return 0
    args, out = argv[1:], None
    if "--json" in args:
        i = args.index("--json")
        out = args[i + 1]
        del args[i:i + 2]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(args[0], errors="replace") as f:
        marks = read_trace(f)
    result = {}
    for path in args[1:]:
        with open(path) as f:
            record = json.load(f)
        rows = summary(record, marks)
        mode = record.get("mode") or path
        result[mode] = rows
        print(table(mode, record.get("count", 0), rows))
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
