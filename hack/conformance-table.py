#!/usr/bin/env python3
"""Reads the JUnit reports of hack/conformance.sh.

  hack/conformance-table.py summary [--focus RE] [--skip RE] JUNIT
      Prints each failed test ("FAILED <name>: <cause>") and then one line
      "N passed, M failed, K skipped" over the tests selected by --focus
      (default: the [NodeConformance] tests); K counts the selected tests that
      --skip or the test itself skipped.

  hack/conformance-table.py table [--out docs/conformance.md]
      Builds docs/conformance.md from _output/conformance/kubelet/ and
      _output/conformance/rustlet/ (junit_01.xml and summary.txt): totals,
      the tests that fail with the upstream kubelet because of this machine
      (with the reason, from MACHINE_REASONS below), rustlet's failures by
      group and by cause, the images that cannot be built here, and one row
      per test with both results and, for each rustlet failure, its cause.

The document is generated: change this script or rerun the suites, never
edit the output by hand.
"""

import argparse
import collections
import datetime
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NC = r"\[NodeConformance\]"
FAILED_STATES = {"failed", "timedout", "interrupted", "aborted", "panicked"}

# Tests that fail with the upstream kubelet because of this machine, not
# because of the kubelet: (regular expression on the test name, reason).
# Each is excluded from rustlet's denominator with this reason written next
# to it in the document. A kubelet failure that matches none is listed as
# unexplained, with its failure message, and stays in the denominator.
MACHINE_REASONS = [
    (
        r"when running a container with a new image should be able to pull image \[",
        "pulls registry.k8s.io/e2e-test-images/agnhost with imagePullPolicy Always; "
        "this machine reaches no container registry",
    ),
    (
        r"PrivilegedPod should enable privileged commands",
        "runs `ip link add dummy1 type dummy` in a privileged container; this machine's kernel has no "
        "dummy network device (\"Operation not supported\" on the host too)",
    ),
    (
        r"read only busybox container should not write to root filesystem",
        "expects busybox sh's exact error text (\"/bin/sh: can't create /file: Read-only file system\"); "
        "the local e2e busybox image's /bin/sh is bash (see Images), which words it differently",
    ),
]

# Kubelet failures that are not this machine's doing but are explained:
# (regular expression on the test name, note). They stay in rustlet's
# denominator.
KUBELET_NOTES = [
    (
        r"should function for node-pod communication: udp",
        "the kubelet run's agnhost image still had Debian's busybox sh as /bin/sh, which runs its own "
        "`nc` applet (no `-u`) before PATH's OpenBSD nc; hack/images.sh has used dash since, and the "
        "rustlet run had it",
    ),
]

# Images of test/utils/image/manifest.go that the [NodeConformance] tests
# name but hack/images.sh cannot build here, and what that blocks. (The
# others are built: see hack/images.sh.)
UNBUILDABLE_IMAGES = [
    (
        "gcr.io/k8s-authenticated-test/agnhost:2.6 (AgnhostPrivate)",
        "a private registry's image, pulled with credentials; no [NodeConformance] test uses it "
        "(the private-registry tests run agnhost's fake-registry-server on localhost:5000 instead)",
    ),
    (
        "invalid.registry.k8s.io/invalid/alpine:3.1 (InvalidRegistryImage)",
        "must not exist: \"should not be able to pull image from invalid registry\" expects the pull to fail",
    ),
]

# Images the issue names that test/utils/image/manifest.go at v1.37.2 no
# longer has, and images built with less than upstream's content.
IMAGE_NOTES = [
    "busybox:1.37.0-2 (the e2e busybox) is Debian's busybox 1.35 with Debian's bash as /bin/sh: "
    "busybox's sh drops environment variables whose names are not shell identifiers, so the "
    "envFrom tests (`sh -c env` must show `data-1=value-1`) could not pass with it; bash keeps them. "
    "The price is one test that expects busybox sh's own error text (see above).",
    "agnhost has Debian's curl, OpenBSD nc, bash, socat and ip, dash as /bin/sh (Debian's busybox sh "
    "runs its own applets before PATH), upstream's /agnhost-2, /uploads, localhost.crt/.key, user and "
    "group, and /var/registry with a copy of the local pause image as pause:testing for "
    "fake-registry-server; not upstream's iperf, dig and coredns. The copy differs from "
    "registry.k8s.io/pause:3.10.2 by one environment variable (upstream's is the same image): "
    "once a test pulled it with a secret, the kubelet would otherwise make every later pod that runs "
    "pause as a container pull it again, from a registry this machine cannot reach. (The runs below "
    "are from before that change; the private-registry tests ran last in them, so nothing came after.)",
    "httpd: not in manifest.go at v1.37.2 (the e2e tests use nginx and agnhost instead); not built.",
    "glibc-dns-testing:2.1.1 is built with dash, GNU hostname and busybox only: upstream's dnsutils "
    "(dig, nslookup) and coredns are missing, which only the DNS tests (not [NodeConformance], and "
    "needing a cluster DNS this cluster does not run) use.",
    "perl:5.26 holds Debian's perl 5.36 with the perl-base modules only; no e2e test uses it today.",
    "nginx:1.27.0-2 and nginx:1.28.0-2 are both Debian's nginx 1.22 (the tests only need an image "
    "that differs from busybox and serves port 80).",
]

# Added to a failure's text when the test's log shows exec requests that the
# node API refused: a generic failure message then has that cause.
EXEC_404 = "(the test's log shows exec refused by the node API with 404)"


# Causes of failures: (regular expression on the failure text, cause). The
# first match wins and the cause may use its groups (\\1); a failure that
# matches none is shown by the first lines of its message, shortened.
CAUSES = [
    (r"unable to upgrade connection: 404", "exec: the node API has no exec endpoint (upgrade: 404)"),
    (r"unable to upgrade connection|error dialing backend.*10250", "exec: the node API does not serve exec"),
    (r"(?s)failed to get logs.*?(10250|connection refused|error dialing backend)",
     "logs: the node API does not serve container logs"),
    (r'failed to match regexp "GET /echo\\\\\?msg=(poststart|prestop)"',
     "lifecycle hook: the \\1 hook never reached the hook server"),
    (r"expected number of restarts: \d+, found restarts: \d+",
     "liveness probe: the container was not restarted"),
    (r"Pod became ready before it's \S+ initial delay", "readiness probe: initialDelaySeconds not honoured"),
    (r"after startupProbe succeeded", "startup probe: readiness not probed promptly after startup"),
    (r"expected hosts file to contain entries from HostAliases", "/etc/hosts: hostAliases not written"),
    (r"hostname: Temporary failure in name resolution", "/etc/hosts: the pod's own hostname not written"),
    (r"(?s)Told to stop trying.*?failed with status.*?exitCode: (\d+)",
     "pod failed: the container exited with code \\1"),
    (r"(?s)Told to stop trying.*?failed with status.*?message: '?([^'\n]{1,80})",
     "pod failed: \\1"),
    (r"(?s)expected \"(.{1,60}?)\" in container output",
     "container output lacks \"\\1\""),
    (r"Failed to open websocket to \S+/exec", "exec over websocket: the node API does not serve exec"),
    (r"expected pod to be container debugger running", "ephemeral containers: the debug container never ran"),
    (r"failed to see container restart", "container restart rules: the container was not restarted"),
    (r"expected pod to be failed with reason (\w+)", "the pod was not failed with reason \\1"),
    (r"expected pod to be terminated with reason (\w+)", "the pod was not terminated with reason \\1"),
    (r"failed to wait for pod terminate", "the pod never completed"),
    (r"Negation of \"pod should not be ready\" failed", "readiness: the pod was ready when it should not be"),
    (r"(?s)(?:expected pod to be running and ready|to be running and ready)",
     "the pod never became running and ready"),
    (r"timeout to wait pod status ready", "the pod never became ready"),
    (r"failed waiting for container terminated", "the container never terminated"),
    (r"(?s)(?:failed to find expected endpoints|connections failed).*" + re.escape(EXEC_404),
     "exec: the node API has no exec endpoint (the networking checks run curl and nc through exec)"),
    (r"failed to find expected endpoints|connections failed", "pod networking: the test endpoint was not reached"),
]
def spec_name(tc):
    """The spec's full text, without ginkgo's leaf-node prefix."""
    name = tc.get("name", "")
    return re.sub(r"^\[(It|DeferCleanup[^\]]*)\]\s*", "", name)


def failure_text(tc):
    for tag in ("failure", "error"):
        el = tc.find(tag)
        if el is not None:
            text = (el.text or el.get("message") or "").strip()
            log = tc.findtext("system-err") or ""
            if "unable to upgrade connection: 404" in log:
                text += "\n" + EXEC_404
            return text
    return ""


# Lines of a gomega object dump: the failure's detail, not its cause.
DUMP_LINE = re.compile(r"^(metadata|creationTimestamp|generation|managedFields|apiVersion|kind|spec|status|"
                       r"conditions|- lastProbeTime|[{}]|s: )")


def shorten(text, limit=150):
    """The first informative lines of a failure message, on one line."""
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("In [") or line.startswith("There were additional failures"):
            continue
        if DUMP_LINE.match(line):
            break
        line = re.sub(r"^\[FAILED\]\s*", "", line)
        # gomega's type annotations: <*v1.Pod | 0xc000123>: and <string>:
        line = re.sub(r"<[^<>]*\| 0x[0-9a-f]+>:?", "", line)
        line = re.sub(r"<[][*a-zA-Z0-9_.]+>:\s*", "", line)
        line = line.strip()
        if line:
            lines.append(line)
        if len(" ".join(lines)) > limit or len(lines) >= 4:
            break
    s = re.sub(r"\s+", " ", " ".join(lines))
    s = s.replace("|", "\\|")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def cause_of(text):
    for pattern, cause in CAUSES:
        m = re.search(pattern, text)
        if m:
            return m.expand(cause).replace("|", "\\|")
    if EXEC_404 in text:
        return "exec refused (404) in the test's log; then: " + shorten(text.replace(EXEC_404, ""), 110)
    return shorten(text)


def normalize(cause):
    """A grouping key: names, numbers and durations made generic."""
    s = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uid>", cause)
    s = re.sub(r"\b[a-z0-9]+(?:-[a-z0-9]+)*-[0-9]+\b", "<name>", s)
    s = re.sub(r"\b[a-z0-9]+(?:-[a-z0-9]+)*-[a-z0-9]{5}\b", "<name>", s)
    s = re.sub(r"\d+(\.\d+)?(ms|s|m)\b", "<t>", s)
    s = re.sub(r"\d+", "N", s)
    return s[:80]


def read_report(path):
    """{name: (state, skip message, failure text, seconds)} and suite-level failures."""
    tree = ET.parse(path)
    specs, suite_failures = {}, []
    for tc in tree.iter("testcase"):
        raw = tc.get("name", "")
        state = tc.get("status", "")
        if not raw.startswith("[It]"):
            if state in FAILED_STATES:
                suite_failures.append((raw, failure_text(tc)))
            continue
        skipped = tc.find("skipped")
        specs[spec_name(tc)] = (
            state,
            skipped.get("message", "") if skipped is not None else "",
            failure_text(tc),
            float(tc.get("time", "0") or 0),
        )
    return specs, suite_failures


def classify(specs, focus, skip):
    """Selected specs: {name: 'passed'|'failed'|'skipped'|'not run'}."""
    focus_re = re.compile(focus)
    skip_re = re.compile(skip) if skip else None
    out = {}
    for name, (state, skip_msg, _, _) in specs.items():
        if not focus_re.search(name):
            continue
        if state == "passed":
            out[name] = "passed"
        elif state in FAILED_STATES:
            out[name] = "failed"
        elif state == "skipped" and skip_msg.startswith("skipped - "):
            out[name] = "skipped"
        elif skip_re is not None and skip_re.search(name):
            out[name] = "not run"
        else:
            # Selected, not skipped by --skip, yet never run: the run was cut
            # short (timeout, interrupt) before it.
            out[name] = "not reached"
    return out


def cmd_summary(args):
    specs, suite_failures = read_report(args.junit)
    results = classify(specs, args.focus, args.skip)
    counts = collections.Counter(results.values())
    for raw, text in suite_failures:
        print(f"SUITE {raw}: {shorten(text)}")
    for name in sorted(n for n, r in results.items() if r == "failed"):
        print(f"FAILED {name}: {cause_of(specs[name][2])}")
    skipped = counts["skipped"] + counts["not run"] + counts["not reached"]
    if counts["not reached"]:
        print(f"NOT REACHED {counts['not reached']} selected tests: the run was cut short")
    print(f"{counts['passed']} passed, {counts['failed']} failed, {skipped} skipped")


def read_summary(path):
    info = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.partition(": ")
                if sep and re.fullmatch(r"[a-z0-9 ]+", key):
                    info.setdefault(key, value.strip())
    except FileNotFoundError:
        pass
    return info


def machine_reason(name):
    for pattern, reason in MACHINE_REASONS:
        if re.search(pattern, name):
            return reason
    return None


def cell(result):
    return {"passed": "pass", "failed": "**FAIL**", "skipped": "skip", "not run": "–", "not reached": "n/r",
            None: "·"}[result]


def minutes(duration):
    """'1532.3s' as '26 minutes'."""
    m = re.fullmatch(r"([0-9.]+)s", duration)
    return f"{float(m.group(1)) / 60:.0f} minutes" if m else duration


def md_escape(s):
    return s.replace("|", "\\|")


def cmd_table(args):
    base = args.base or os.path.join(ROOT, "_output", "conformance")
    runs = {}
    for agent in ("kubelet", "rustlet"):
        junit = os.path.join(base, agent, "junit_01.xml")
        if not os.path.exists(junit):
            sys.exit(f"conformance-table: missing {junit} (run hack/conformance.sh --agent {agent})")
        info = read_summary(os.path.join(base, agent, "summary.txt"))
        specs, suite_failures = read_report(junit)
        focus = info.get("focus") or NC
        skip = info.get("skip", "")
        runs[agent] = dict(info=info, specs=specs, suite=suite_failures,
                           results=classify(specs, focus, skip))
    kub, rus = runs["kubelet"], runs["rustlet"]

    def count(run, what):
        return sum(1 for r in run["results"].values() if r == what)

    names = sorted(set(kub["results"]) | set(rus["results"]))

    machine = {}
    unexplained = {}
    for n in names:
        if kub["results"].get(n) == "failed":
            reason = machine_reason(n)
            if reason:
                machine[n] = reason
            else:
                note = next((t for p, t in KUBELET_NOTES if re.search(p, n)), None)
                unexplained[n] = note or cause_of(kub["specs"][n][2])
    # Rustlet's denominator: tests that ran with rustlet, less those failing
    # with the kubelet because of this machine.
    ran = [n for n in names if rus["results"].get(n) in ("passed", "failed")]
    denom = [n for n in ran if n not in machine]
    rus_pass = [n for n in denom if rus["results"][n] == "passed"]
    both_pass = [n for n in names if kub["results"].get(n) == "passed" and rus["results"].get(n) == "passed"]
    kub_pass = [n for n in names if kub["results"].get(n) == "passed"]
    rus_fail = [n for n in names if rus["results"].get(n) == "failed"]
    rus_only = [n for n in names if rus["results"].get(n) == "passed" and kub["results"].get(n) != "passed"]

    out = []
    w = out.append
    w("# Node conformance: rustlet and the upstream kubelet")
    w("")
    w("Generated by `hack/conformance-table.py table` from the JUnit reports that "
      "`hack/conformance.sh --agent kubelet` and `hack/conformance.sh --agent rustlet` write to "
      "`_output/conformance/<agent>/`. Do not edit by hand: rerun the suites and the script.")
    w("")
    w(f"Generated {datetime.date.today().isoformat()}. "
      f"Tests: the `[NodeConformance]` tests of the upstream e2e suite "
      f"(k8s.io/kubernetes {kub['info'].get('kubernetes', '?').split(' ')[0]} `e2e.test`), "
      "on the local one-node cluster (`hack/local-up.sh`): containerd 2 with runc and bridge CNI, "
      "images built locally (`hack/images.sh`), no cluster DNS, no kube-proxy, no network beyond this machine.")
    w("")
    for agent, run in runs.items():
        i = run["info"]
        extra = f", rustlet {i['rustlet']}" if agent == "rustlet" and "rustlet" in i else ""
        unreached = count(run, "not reached")
        cut = (f" The run was interrupted from outside before {unreached} of its tests (`n/r` below); "
               "they count as not run." if unreached else "")
        w(f"- {agent}: run {i.get('date', '?')}, {minutes(i.get('e2e run', '?'))} with {i.get('procs', '?')} "
          f"parallel processes{extra}; focus `{i.get('focus', NC)}`, skip `{i.get('skip', '')}`.{cut}")
    w("")
    w("The default skip of `hack/conformance.sh` is `\\[Slow\\]|\\[Disruptive\\]|\\[Flaky\\]`, for time: the "
      "`[Slow]` tests are 127 pod-level in-place resize cases and back-off tests of up to 27 minutes, hours "
      "in all on 2 cores; no `[NodeConformance]` test is `[Disruptive]` or `[Flaky]`. `[Serial]` tests run "
      "(after the others, one at a time).")
    w("")
    w("## Totals")
    w("")
    w("| | kubelet | rustlet |")
    w("| --- | ---: | ---: |")
    w(f"| `[NodeConformance]` tests | {len(kub['results'])} | {len(rus['results'])} |")
    w(f"| run | {count(kub, 'passed') + count(kub, 'failed')} | {count(rus, 'passed') + count(rus, 'failed')} |")
    w(f"| passed | {count(kub, 'passed')} | {count(rus, 'passed')} |")
    w(f"| failed | {count(kub, 'failed')} | {count(rus, 'failed')} |")
    w(f"| skipped by the test itself | {count(kub, 'skipped')} | {count(rus, 'skipped')} |")
    w(f"| not run (`--skip`) | {count(kub, 'not run')} | {count(rus, 'not run')} |")
    if count(kub, "not reached") or count(rus, "not reached"):
        w(f"| not reached (the run was interrupted first) | {count(kub, 'not reached')} | "
          f"{count(rus, 'not reached')} |")
    w("")
    pct = f"{100 * len(rus_pass) / len(denom):.0f}%" if denom else "n/a"
    w(f"**rustlet passes {len(rus_pass)} of {len(denom)} tests ({pct})**: the {len(ran)} tests it ran, less "
      f"the {len(ran) - len(denom)} of them that fail with the upstream kubelet because of this machine "
      "(next section). "
      f"The kubelet passes {len(kub_pass)}; both pass {len(both_pass)}"
      + (f"; rustlet alone passes {len(rus_only)}." if rus_only else "."))
    w("")
    w("## Tests that fail with the upstream kubelet on this machine")
    w("")
    if machine:
        w("Excluded from rustlet's denominator, each for the reason given.")
        w("")
        w("| test | reason | rustlet |")
        w("| --- | --- | --- |")
        for n in sorted(machine):
            w(f"| {md_escape(n)} | {machine[n]} | {cell(rus['results'].get(n))} |")
    else:
        w("None.")
    w("")
    if unexplained:
        w("### Other kubelet failures")
        w("")
        w("Not this machine's doing: these stay in rustlet's denominator.")
        w("")
        w("| test | kubelet's failure |")
        w("| --- | --- |")
        for n in sorted(unexplained):
            w(f"| {md_escape(n)} | {unexplained[n]} |")
        w("")
    for agent, run in runs.items():
        if run["suite"]:
            w(f"Suite-level failures with {agent}: " + "; ".join(
                f"`{md_escape(r)}`: {shorten(t)}" for r, t in run["suite"]))
            w("")

    w("## Rustlet failures by group")
    w("")
    w("Grouped by the test's source file under test/e2e (one feature each), with the words its tests "
      "share.")
    w("")
    files = test_files()
    groups = collections.defaultdict(lambda: [0, 0, []])
    for n in ran:
        g = groups[files.get(n, "(unknown file)")]
        g[1] += 1
        g[2].append(n)
        if rus["results"][n] == "failed":
            g[0] += 1
    w("| file | tests | rustlet failed | of run |")
    w("| --- | --- | ---: | ---: |")
    for g, (f, t, members) in sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0])):
        if f:
            w(f"| {g} | {md_escape(common_prefix(members))} | {f} | {t} |")
    w("")
    w("## Rustlet failures by cause")
    w("")
    causes = collections.Counter()
    example = {}
    for n in rus_fail:
        c = cause_of(rus["specs"][n][2])
        key = normalize(c)
        causes[key] += 1
        example.setdefault(key, c)
    w("| cause (first failure message, shortened) | tests |")
    w("| --- | ---: |")
    for key, k in causes.most_common():
        w(f"| {example[key]} | {k} |")
    w("")
    w("## Images")
    w("")
    w("Built by `hack/images.sh` under the names of test/utils/image/manifest.go: pause, busybox, agnhost "
      "(also as the previous agnhost), nonroot, nonewprivs, nginx, perl, glibc-dns-testing. Not built:")
    w("")
    for image, why in UNBUILDABLE_IMAGES:
        w(f"- {image}: {why}.")
    for note in IMAGE_NOTES:
        w(f"- {note}")
    w("")
    w("## All tests")
    w("")
    w("`pass`, **FAIL**, `skip` (the test skipped itself), `–` (not run: `--skip`), `n/r` (not reached: "
      "the run was interrupted before it).")
    w("")
    w("| test | kubelet | rustlet | rustlet failure cause |")
    w("| --- | --- | --- | --- |")
    for n in names:
        k, r = kub["results"].get(n), rus["results"].get(n)
        why = cause_of(rus["specs"][n][2]) if r == "failed" else ""
        w(f"| {md_escape(n)} | {cell(k)} | {cell(r)} | {why} |")
    w("")
    text = "\n".join(out)
    path = args.out or os.path.join(ROOT, "docs", "conformance.md")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"conformance-table: wrote {os.path.relpath(path, ROOT)}: {len(names)} tests; "
          f"kubelet {len(kub_pass)} passed; rustlet {len(rus_pass)} of {len(denom)} passed")


def test_files():
    """{test name: source file under test/e2e}, from `e2e.test --list-tests`."""
    e2e = os.path.join(ROOT, "_output", "bin", "e2e.test")
    files = {}
    try:
        out = subprocess.run([e2e, "--list-tests"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return files
    for line in out.splitlines():
        m = re.match(r"\s*\S*?/test/e2e/(\S+?):\d+: (.*)$", line)
        if m:
            files[m.group(2).strip()] = m.group(1)
    return files


def common_prefix(names):
    """The words every name starts with: the file's Describe, roughly."""
    words = [n.split() for n in names]
    prefix = []
    for column in zip(*words):
        if len(set(column)) != 1:
            break
        prefix.append(column[0])
    return " ".join(prefix)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary", help="counts of one run")
    s.add_argument("--focus", default=NC)
    s.add_argument("--skip", default="")
    s.add_argument("junit")
    t = sub.add_parser("table", help="write docs/conformance.md")
    t.add_argument("--out")
    t.add_argument("--base", help="directory holding kubelet/ and rustlet/ (default _output/conformance)")
    args = p.parse_args()
    {"summary": cmd_summary, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main()
