#!/usr/bin/env python3
"""Turns the raw records of hack/bench.sh into results.json, results.md and
latency.png (in the same directory), and prints the markdown table.

    hack/bench-report.py DIR

DIR holds bare-{single,burst}.json, {kubelet,rustlet}-{idle,single,burst,steady}.json
(from bench/bare_cri.rs and bench/pod_start.rs) and {kubelet,rustlet}-audit.log
(the API server's audit log of the node's requests: one JSON event a line).
API requests are counted from the audit log because apiserver_request_total
has no label for the client.
"""

import json
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

AGENTS = ("kubelet", "rustlet")
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
# Requests an agent makes whether or not pods come and go.
BACKGROUND = {"leases", "nodes"}


def load(d, name):
    p = d / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def ts(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def audit_events(path):
    """Each request once (by auditID): (received time, verb, resource)."""
    seen = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        ref = ev.get("objectRef") or {}
        res = ref.get("resource", ev.get("requestURI", "?"))
        if ref.get("subresource"):
            res += "/" + ref["subresource"]
        seen[ev["auditID"]] = (ts(ev["requestReceivedTimestamp"]), ev["verb"], res)
    return list(seen.values())


def count_in(events, rec):
    """Requests inside the record's window, by (verb, resource)."""
    lo, hi = ts(rec["window_start"]), ts(rec["window_end"])
    return Counter((v, r) for t, v, r in events if lo <= t <= hi)


def per_pod_api(events, rec):
    c = count_in(events, rec)
    n = max(rec["count"], 1)
    pods = {k: v for k, v in c.items() if k[1].split("/")[0] not in BACKGROUND}
    writes = sum(v for (verb, _), v in pods.items() if verb in WRITES)
    reads = sum(v for (verb, _), v in pods.items() if verb not in WRITES)
    detail = {f"{verb} {res}": round(v / n, 2) for (verb, res), v in sorted(pods.items())}
    return {"writes_per_pod": writes / n, "reads_per_pod": reads / n, "by_request": detail}


def idle_api(events, rec):
    c = count_in(events, rec)
    minutes = max((ts(rec["window_end"]) - ts(rec["window_start"])).total_seconds() / 60, 1e-9)
    return {f"{verb} {res}": round(v / minutes, 2) for (verb, res), v in sorted(c.items())}


def main():
    d = Path(sys.argv[1] if len(sys.argv) > 1 else "_output/bench")
    r = {"bare": {k: load(d, f"bare-{k}") for k in ("single", "burst")}}
    for a in AGENTS:
        r[a] = {k: load(d, f"{a}-{k}") for k in ("idle", "single", "burst", "steady")}
        ev = audit_events(d / f"{a}-audit.log")
        if r[a]["single"]:
            r[a]["api"] = per_pod_api(ev, r[a]["single"])
        if r[a]["idle"]:
            r[a]["idle_api_per_minute"] = idle_api(ev, r[a]["idle"])

    def get(subject, *path):
        v = r.get(subject)
        for p in path:
            if v is None:
                return None
            v = v.get(p)
        return v

    rows = []  # (figure, unit, bare, kubelet, rustlet, target text, met)

    def row(name, unit, path, bare_path=None, target=None):
        b = get("bare", *bare_path) if bare_path else None
        k, ru = get("kubelet", *path), get("rustlet", *path)
        met = None
        if target and ru is not None:
            text, ok = target(ru, k, b)
            met = (text, ok)
        rows.append((name, unit, b, k, ru, met))

    row("(a) create → Running p50", "s", ("single", "start", "p50"), ("single", "start", "p50"),
        lambda ru, k, b: ("≤ bare + 0.15 s and ≤ 0.6 × kubelet",
                          b is not None and k is not None and ru <= b + 0.15 and ru <= 0.6 * k))
    row("(a) create → Running p99", "s", ("single", "start", "p99"), ("single", "start", "p99"))
    row("(a) delete → gone p50", "s", ("single", "delete", "p50"))
    row("(a) delete → gone p99", "s", ("single", "delete", "p99"))
    row("(b) burst: each pod → Running p50", "s", ("burst", "start", "p50"), ("burst", "start", "p50"))
    row("(b) burst: each pod → Running p99", "s", ("burst", "start", "p99"), ("burst", "start", "p99"))
    row("(b) burst: all Running (wall)", "s", ("burst", "all_running_s"), ("burst", "all_running_s"),
        lambda ru, k, b: ("≤ 1.1 × bare", b is not None and ru <= 1.1 * b))
    row("(b) burst: all gone after delete", "s", ("burst", "all_gone_s"))
    row("(c) steady: all Running (wall)", "s", ("steady", "all_running_s"))
    row("(c) steady: all gone after delete", "s", ("steady", "all_gone_s"))
    row("(d) idle RSS", "MiB", ("idle", "agent", "rss_mib_mean"), None,
        lambda ru, k, b: ("≤ 15 MiB", ru <= 15))
    row("(d) idle RSS: anonymous (heap, stacks)", "MiB", ("idle", "agent", "rss_anon_mib_mean"))
    row("(d) idle RSS: file-backed (code)", "MiB", ("idle", "agent", "rss_file_mib_mean"))
    row("(d) idle CPU", "cores", ("idle", "agent", "cpu_cores"), None,
        lambda ru, k, b: ("≤ 0.005 core", ru <= 0.005))
    row("(a) RSS, max", "MiB", ("single", "agent", "rss_mib_max"))
    row("(b) burst RSS, max", "MiB", ("burst", "agent", "rss_mib_max"))
    row("(b) burst CPU", "cores", ("burst", "agent", "cpu_cores"))
    row("(c) RSS with steady pods", "MiB", ("steady", "agent", "rss_mib_mean"), None,
        lambda ru, k, b: ("≤ 40 MiB", ru <= 40))
    row("(c) CPU with steady pods", "cores", ("steady", "agent", "cpu_cores"))
    row("API writes per pod lifecycle", "requests", ("api", "writes_per_pod"), None,
        lambda ru, k, b: ("≤ kubelet", k is not None and ru <= k))
    row("API reads per pod lifecycle", "requests", ("api", "reads_per_pod"))

    def fmt(v, unit):
        if v is None:
            return "–"
        if unit == "cores":
            return f"{v:.4f}"
        if unit == "MiB":
            return f"{v:.1f}"
        if unit == "requests":
            return f"{v:.2f}"
        return f"{v:.3f}"

    def ratio(a, b):
        return f"{a / b:.2f}" if a is not None and b else "–"

    counts = {m: get("rustlet", m, "count") or get("kubelet", m, "count")
              for m in ("single", "burst", "steady")}
    lines = [
        f"Workloads: (a) {counts['single']} pods one at a time, (b) a burst of {counts['burst']}, "
        f"(c) {counts['steady']} pods steady, (d) an idle node.",
        "",
        "| figure | unit | bare CRI | kubelet | rustlet | rustlet/kubelet | rustlet/bare | target | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    table = []
    for name, unit, b, k, ru, met in rows:
        lines.append(
            f"| {name} | {unit} | {fmt(b, unit)} | {fmt(k, unit)} | {fmt(ru, unit)} | "
            f"{ratio(ru, k)} | {ratio(ru, b)} | {met[0] if met else ''} | "
            f"{('yes' if met[1] else '**no**') if met else ''} |")
        table.append({"figure": name, "unit": unit, "bare": b, "kubelet": k, "rustlet": ru,
                      "target": met[0] if met else None, "met": met[1] if met else None})
    for a in AGENTS:
        api = get(a, "api", "by_request")
        if api:
            lines += ["", f"{a}: API requests per pod lifecycle (leases and nodes left out): "
                      + ", ".join(f"{k} {v}" for k, v in api.items())]
        idle = get(a, "idle_api_per_minute")
        if idle:
            lines += ["", f"{a}: API requests per minute when idle: "
                      + ", ".join(f"{k} {v}" for k, v in idle.items())]
    md = "\n".join(lines) + "\n"
    (d / "results.md").write_text(md)
    (d / "results.json").write_text(json.dumps({"table": table, "raw": r}, indent=2) + "\n")
    print(md)
    plot(d, r)


def plot(d, r):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("(a) create → Running, one at a time", "single", "start"),
              ("(a) delete → gone, one at a time", "single", "delete"),
              ("(b) burst: each pod → Running", "burst", "start")]
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.5))
    for ax, (title, work, fig_key) in zip(axes, panels):
        for subject, style, color in (("bare", ":", "tab:blue"), ("kubelet", "--", "tab:orange"),
                                      ("rustlet", "-", "tab:green")):
            rec = (r.get(subject) or {}).get(work)
            samples = ((rec or {}).get(fig_key) or {}).get("samples")
            if not samples:
                continue
            xs = sorted(samples)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, style, color=color, where="post", label="bare CRI" if subject == "bare" else subject)
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.set_ylabel("fraction of pods")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(d / "latency.png", dpi=100)


if __name__ == "__main__":
    main()
