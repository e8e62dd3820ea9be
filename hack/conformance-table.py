#!/usr/bin/env python3
"""Reads the JUnit reports of hack/conformance.sh.

  hack/conformance-table.py summary [--focus RE] [--skip RE] [--expect FILE] JUNIT...
      Merges the reports of one run's shards (a spec's result is the one
      from the shard that ran it), prints each failed test ("FAILED <name>:
      <cause>") and then one line "N passed, M failed, K skipped" over the
      tests selected by --focus (default: the [NodeConformance] tests); K
      counts the selected tests that --skip or the test itself skipped, or
      that a cut-short run never reached.
      --expect FILE: one regular expression per line ('#' comments and blank
      lines ignored); each must match a selected test that ran (passed or
      failed). Prints "MISSING <regex>" for each that matches none, before
      the count line, and exits 1 if any is missing.

  hack/conformance-table.py keep [--focus RE] JUNIT OUT
      Writes OUT (.xml.gz): the part of a JUnit report the table reads (the
      specs the focus selects, their results and failure texts), a few
      kilobytes. A sitting keeps its runs so, in docs/conformance/.

  hack/conformance-table.py table [--base DIR] [--out FILE]
      Builds docs/conformance.md from the result sets under
      _output/conformance/<set>/<agent>/ (summary.txt and
      shard-<k>/junit_01.xml, or its kept form junit_01.xml.gz), <set> one of
      SETS below and <agent> kubelet or rustlet; the e2e set of both agents
      is required, the others are shown when present. A sitting passes
      --base docs/conformance, where it keeps its runs.

  hack/conformance-table.py selftest
      Runs the examples of this file (doctest).

The document is generated: change this script or rerun the suites, never
edit the output by hand.
"""

import argparse
import collections
import dataclasses
import doctest
import glob
import gzip
import io  # the examples (doctest) read reports from strings
import math
import os
import re
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NC = r"\[NodeConformance\]"
FAILED_STATES = {"failed", "timedout", "interrupted", "aborted", "panicked"}
AGENTS = ("kubelet", "rustlet")

# The result sets hack/conformance.sh writes, in the document's order: (name,
# title, what it is). Their focus and skip are read from each run's
# summary.txt, never assumed.
SETS = [
    ("e2e", "e2e.test [NodeConformance] without [Slow]",
     "`e2e.test`, the `[NodeConformance]` tests of the upstream e2e suite that are not `[Slow]`"),
    ("e2e-slow", "e2e.test [NodeConformance] [Slow]",
     "`e2e.test`, only the `[NodeConformance]` tests that are `[Slow]` (hours in all: back-off "
     "tests of many minutes, pod-level in-place resize tables)"),
    ("node", "e2e_node.test [NodeConformance]",
     "`e2e_node.test`, the `[NodeConformance]` tests of test/e2e_node, the node's own suite (static "
     "and mirror pods, the node API's endpoints, cgroups, garbage collection, device plugins, and the "
     "common pod tests it shares with e2e.test)"),
    ("node-protection", "e2e_node.test node protection",
     "`e2e_node.test`'s tests of garbage collection, eviction and the summary API, most of them "
     "`[Serial]`, `[Disruptive]` or `[Slow]` and outside `[NodeConformance]` "
     "(`hack/conformance.sh --suite node-protection`; the focus and skip are in the run's "
     "summary)"),
    ("node-resources", "e2e_node.test pod PID limits and huge pages",
     "`e2e_node.test`'s tests of `podPidsLimit` (`PodPidsLimit`) and of huge pages (`HugePages`, "
     "`Pod Level HugePages Resources`), all `[Serial]`: each reserves huge pages or sets the "
     "limit and restarts the agent, then reads the pod's cgroup files through a hostPath pod "
     "(`hack/conformance.sh --suite node-resources`)"),
    ("node-cpu", "e2e_node.test CPU, memory and topology managers",
     "`e2e_node.test`'s tests of the CPU manager, the memory manager and the topology manager and "
     "their metrics, all `[Serial]`: each writes a configuration with the static policies and "
     "restarts the agent, whose root directory is `/var/lib/kubelet`, where the suite reads and "
     "removes the managers' checkpoints; not those of pod-level resource managers (alpha gate "
     "`PodLevelResourceManagers`). Most skip themselves on this machine (2 CPUs, one NUMA node, no "
     "SMT siblings, cgroup v1), with the reason in the table below "
     "(`hack/conformance.sh --suite node-cpu`)"),
    ("certificates", "e2e.test pod certificates and trust bundles",
     "`e2e.test`'s `[sig-auth]` tests of projected `podCertificate` volumes (the suite runs its own "
     "signer), of `clusterTrustBundle` volumes and of the PodCertificateRequest API, without "
     "`[Slow]` and off-by-default gates (`hack/conformance.sh --suite certificates`)"),
    ("dra", "e2e_node.test [DRA]",
     "`e2e_node.test`'s dynamic resource allocation tests (test/e2e_node/dra_test.go, `[DRA]`, all "
     "`[Serial]`, one `[Disruptive]`): DRA drivers registering with the agent, claims prepared and "
     "unprepared across agent and driver restarts, the node's ResourceSlices wiped, device health in "
     "the pod's status, against upstream's test driver, which the suite runs in process with the "
     "kubelet's default paths (`hack/conformance.sh --suite dra`; a sitting runs it only when named: "
     "`hack/conformance-sitting.sh dra:kubelet dra:rustlet`). `e2e.test`'s own `[sig-node] [DRA]` tests "
     "(106 of them without `[Slow]`, `[Disruptive]`, `[Flaky]` and off-by-default gates) are not run, "
     "for either agent: their driver pods run `registry.k8s.io/sig-storage/hostpathplugin:v1.17.1` "
     "(test/e2e/dra/utils/deploy.go), no image registry is reachable here, and the Go module proxy "
     "refuses its module, `github.com/kubernetes-csi/csi-driver-host-path` (403 at every version), so "
     "it cannot be built as the other images are"),
    ("storage", "e2e.test [sig-storage] local and hostPath volumes",
     "`e2e.test`'s `[sig-storage]` tests that need no storage driver: the in-tree `hostPath`, "
     "`hostPathSymlink` and `local` volume test suites and `PersistentVolumes-local` (claims bound "
     "to local PersistentVolumes of each local volume type, subPaths, fsGroup), not `[Slow]`; "
     "containerd runs as pid 1 of a pid namespace of its own, so that the tests' hostexec pods can "
     "enter the node's mount namespace through /proc/1 (`hack/conformance.sh --suite storage`, "
     "`hack/local-up.sh --runtime-pid-ns`)"),
    ("storage-csi", "e2e.test storage suites on a CSI driver (External Storage)",
     "`e2e.test`'s storage test suites (provisioning, volumes, subPath, multiVolume, ephemeral, fsGroup, "
     "...) run against an installed CSI driver, as the suite runs them for any driver (External Storage, "
     "`--storage.testdriver hack/csi-testdriver.yaml`): the project's hostpath test driver behind the "
     "upstream external-provisioner and external-attacher (`hack/csi-stack.sh`), not `[Slow]` "
     "(`hack/conformance.sh --suite storage-csi`)"),
]
# A derived line: the union of two sets of the same sitting whose tests do
# not overlap (e2e skips [Slow], e2e-slow runs only [Slow]).
UNION = ("e2e+slow", "e2e.test [NodeConformance] with [Slow]", ("e2e", "e2e-slow"))

# The tags a --skip pattern usually names; other alternatives of the pattern
# are counted under "other" and listed.
SKIP_TAGS = ("[Slow]", "[Disruptive]", "[Flaky]")

# What a failing test exercises, where its name makes it obvious: (regular
# expression on the test name, capability). The first match wins, so put the
# narrower patterns first; a test that matches none is "other". Add a line
# here when a new group of failures shows up.
CAPABILITIES = [
    (r"\[DRA\]", "dynamic resource allocation"),
    (r"StaticPod|MirrorPod", "static pods and mirror pods (issue: static pods)"),
    (r"InPlace Resize|Resize", "in-place resize"),
    (r"POD Resources API|PodResources", "PodResources API"),
    (r"Summary API", "summary API"),
    (r"GarbageCollect", "container and image GC"),
    (r"Eviction", "eviction"),
    (r"Device Plugin", "device plugins"),
    (r"Swap", "swap"),
    (r"Cgroup Manager|QOS|Pod Overhead|PodOverhead", "pod cgroups"),
    (r"CPU Manager", "CPU manager"),
    (r"OOMKiller", "OOM kills"),
    (r"Kubelet Endpoints|/configz", "node API: /configz"),
    (r"KubletTLS|KubeletTLS|ReloadKubeletClientCAFile", "node API: certificate reload"),
    (r"ContainerMetrics|/metrics", "node API: metrics"),
    (r"Probing (container|restartable)", "probes"),
    (r"Lifecycle Hook|Lifecycle [Ss]leep", "lifecycle hooks"),
    (r"Ephemeral Containers", "ephemeral containers"),
    (r"Containers Lifecycle|Restartable Init|InitContainer", "init and sidecar containers"),
    (r"container restart policy|RestartAllContainers|ContainerRestartRules", "container restart rules"),
    (r"Deleted pods|Terminate Pods|Pod SIGKILL|Pod conditions", "pod termination and conditions"),
    (r"ContainerLogPath|logs", "container logs"),
    (r"Hostname of Pod|Override hostname|EtcHosts|/etc/hosts", "hostname and /etc/hosts"),
    (r"Mount recursive read-only", "recursive read-only mounts"),
    (r"Security Context|PrivilegedPod|DefaultProcMount|AppArmor|Sysctls", "security context"),
    (r"RuntimeClass", "runtime classes"),
    (r"\[sig-storage\]", "volumes"),
    (r"\[sig-network\]", "pod networking"),
]

# Tests that fail because of this machine, not because of the node agent:
# (regular expression on the test name, reason). A failure that matches one,
# with either agent, is listed with this reason as caused by the machine; it
# still counts as run and failed. Any other failure is the agent's.
MACHINE_REASONS = [
    (
        r"provisioning should provision storage with any volume data source",
        "runs a volume populator and its validator from registry.k8s.io/sig-storage/hello-populator and "
        "volume-data-source-validator, images this machine can neither pull nor build",
    ),
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
        r"ReloadKubeletClientCAFileTest certificate reload",
        "gives the agent a client CA of its own, then reads /configz through the API server; the node "
        "suite's own harness runs the kubelet with anonymous requests allowed (AlwaysAllow), the local "
        "cluster's node API wants the API server's client certificate, which that CA did not sign, so "
        "either agent refuses it (the kubelet with 401, rustlet at the TLS handshake)",
    ),
]

EXEC_404 = "(the test's log shows exec refused by the node API with 404)"
HOSTEXEC_NSENTER = "(the test's log shows hostexec's nsenter refused: can't open /rootfs/proc/1/ns/mnt)"
HOSTEXEC_BUSYBOX = "(the test's log shows busybox's losetup answering a command run through hostexec's nsenter)"
PULL_BACK_OFF = "(the test's log shows a pod in ImagePullBackOff)"
PULL_ALWAYS = "(the test's log shows a pod with imagePullPolicy Always)"

# Lines of a spec's log (its system-err) that show a failure's cause where
# its failure message does not: (line, what `failure_text` adds). The line
# is kept with a kept report (`compact_report`).
LOG_MARKERS = [
    ("unable to upgrade connection: 404", EXEC_404),
    ("nsenter: can't open '/rootfs/proc/1/ns/mnt': Permission denied", HOSTEXEC_NSENTER),
    ("Usage: losetup [-rP]", HOSTEXEC_BUSYBOX),
    ("reason: ImagePullBackOff", PULL_BACK_OFF),
    ("imagePullPolicy: Always", PULL_ALWAYS),
]

# Failures this machine causes, recognised by their failure text: (regular expression on the failure message, reason).
MACHINE_TEXT_REASONS = [
    (
        r"expected hugepages 1, but found 0",
        "reserves a 1 GiB huge page (hugepages-1Gi) through /sys/kernel/mm/hugepages; this machine's "
        "kernel reserves none (writing 1 to hugepages-1048576kB/nr_hugepages leaves 0), whichever "
        "agent runs",
    ),
    (
        r"failed to resolve image: .*no such host",
        "pulls an image from its registry through CRI (PullImage, or the suite's pre-pull); this "
        "machine reaches no container registry",
    ),
    (
        r"expected pod to be running and ready[\s\S]*" + re.escape(PULL_BACK_OFF) + r"[\s\S]*"
        + re.escape(PULL_ALWAYS),
        "waits for a pod whose image it pulls with imagePullPolicy Always (the eviction tests' "
        "test-admit-pod, registry.k8s.io/pause, in their AfterEach); the pod stays in ImagePullBackOff: "
        "this machine reaches no container registry",
    ),
    (
        r"Expected Pod to be in <v1\.PodPhase>: Running[\s\S]*imagePullPolicy: Always[\s\S]*"
        r"reason: (ErrImagePull|ImagePullBackOff)",
        "waits for a pod to run whose image it pulls with imagePullPolicy Always (agnhost, in the "
        "container lifecycle tests of a regular container's image update); the pull fails "
        "(ErrImagePull, ImagePullBackOff): this machine reaches no container registry",
    ),
    (
        r"failed to execute command in pod sleeping-test-pod-swap-\S+, container busybox-container: "
        r"command terminated with exit code 1",
        "reads cgroup v2's memory.swap.max (`cat /sys/fs/cgroup/memory.swap.max`) in its container "
        "without first checking for cgroup v2, as its sibling swap tests do; this machine is cgroup v1, "
        "where the file does not exist",
    ),
    (
        r"oom_score_adj value 0 not equal to expected -\d+",
        "checks a container's oom_score_adj, negative for a Guaranteed pod (-997) or the node's "
        "critical pods; this host lets no process lower its OOM score (root's write of -997 to "
        "/proc/self/oom_score_adj fails), so containerd runs with restrict_oom_score_adj and gives "
        "the container its own, 0, whichever agent asks",
    ),
    (
        r'Back-off pulling image "registry\.k8s\.io/e2e-test-images/volume/nfs:',
        "runs an NFS server from registry.k8s.io/e2e-test-images/volume/nfs, an image this machine "
        "can neither pull nor build (it needs the kernel's NFS server)",
    ),
    (
        r"nmeter: (command )?not found|parsing time \"\d{4}-\d\d-\d\dTZ",
        "times its events with busybox's nmeter applet, which a local image does not have: Debian's "
        "busybox (in the e2e busybox image of earlier sittings, and in agnhost, which the container "
        "lifecycle tests update a container's image to) leaves it out; upstream's agnhost, on Alpine, has it",
    ),
    (
        re.escape(HOSTEXEC_NSENTER),
        "sets its volume up on the node through a hostexec pod, which runs `nsenter` into the mount "
        "namespace of the host's pid 1 (/rootfs/proc/1/ns/mnt); this machine's pid 1 (the VM's agent) "
        "refuses that to root on the host too",
    ),
    (
        re.escape(HOSTEXEC_BUSYBOX),
        "finds its loop device with `losetup` run through the hostexec pod's `nsenter`; the local "
        "agnhost image's nsenter is Debian busybox's, which runs its own sh and losetup applets in the "
        "node's mount namespace (upstream's agnhost, on Alpine with util-linux-misc, runs the node's)",
    ),
    (
        r"error checking directory /var/lib/kubelet/pods/",
        "lists the pod's volume directories under /var/lib/kubelet, a path the test hard-codes "
        "(test/e2e/storage/testsuites/volumemode.go, whatever --kubelet-root-dir says); the local "
        "cluster's agents keep their root directories under _output/local/",
    ),
]

# Failures that are neither the machine's nor a gap of the agent but are
# explained: (regular expression on the test name, note). Shown instead of
# the cause of the kubelet's failure.
KUBELET_NOTES = [
    (
        r"Kubelet Endpoints .*/configz|KubletTLS certificate reload",
        "calls https://127.0.0.1:10250; for runs started before 2026-11-27T10:10Z `local-up --node-e2e` "
        "bound the kubelet to the bridge address only (rustlet listens on 0.0.0.0, where the node suite's "
        "harness leaves the kubelet), so such a run's call was refused by the harness, not by the kubelet",
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
    "busybox:1.37.0-2 and 1.36.1-1 (the e2e busybox) are busybox 1.37.0 built from its source with "
    "upstream's default configuration (hack/build-cluster.sh busybox): Debian's busybox leaves out nmeter, "
    "which the node suite's lifecycle tests time with, and its sh drops environment variables whose names "
    "are not shell identifiers (the envFrom tests need `data-1=value-1`).",
    "agnhost has Debian's curl, OpenBSD nc, bash, socat and ip, dash as /bin/sh (Debian's busybox sh "
    "runs its own applets before PATH), upstream's /agnhost-2, /uploads, localhost.crt/.key, user and "
    "group, and /var/registry with a copy of the local pause image as pause:testing for "
    "fake-registry-server; not upstream's iperf, dig and coredns. The copy differs from "
    "registry.k8s.io/pause:3.10.2 by one environment variable (upstream's is the same image): "
    "once a test pulled it with a secret, the kubelet would otherwise make every later pod that runs "
    "pause as a container pull it again, from a registry this machine cannot reach.",
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
    """The failure message of testcase `tc`, with what its log shows of the
    cause (LOG_MARKERS).

    >>> tc = ET.fromstring('<testcase><failure>command terminated with exit code 1</failure><system-err>'
    ...     "exec local-node: stderr: nsenter: can't open '/rootfs/proc/1/ns/mnt': Permission denied"
    ...     '</system-err></testcase>')
    >>> machine_reason("[sig-storage] In-tree Volumes volumes should store data", failure_text(tc))[:36]
    'sets its volume up on the node throu'
    >>> machine_reason("x", "command terminated with exit code 1") is None
    True
    """
    for tag in ("failure", "error"):
        el = tc.find(tag)
        if el is not None:
            text = (el.text or el.get("message") or "").strip()
            log = tc.findtext("system-err") or ""
            for line, added in LOG_MARKERS:
                if line in log:
                    text += "\n" + added
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


def open_report(path):
    """A report to parse: a file object as it is, a path ending in .gz unpacked."""
    if isinstance(path, str) and path.endswith(".gz"):
        return gzip.open(path, "rb")
    return path


def read_report(path):
    """{name: (state, skip message, failure text, seconds)} and suite-level failures."""
    tree = ET.parse(open_report(path))
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


def record_rank(record):
    """How much a shard's record of a spec says: ran > skipped itself > not run there."""
    state, skip_msg = record[0], record[1]
    if state in FAILED_STATES:
        return 3
    if state == "passed":
        return 2
    if skip_msg.startswith("skipped - "):
        return 1
    return 0


def read_reports(paths):
    """The reports of one run's shards merged: every spec appears in each
    shard's report, skipped in the shards that did not select it; its record
    is the one from the shard that ran it (or where it skipped itself).

    >>> shard = '<testsuite><testcase name="[It] a" status="{}"/><testcase name="[It] b" status="{}"/></testsuite>'
    >>> specs, _ = read_reports([io.StringIO(shard.format("passed", "skipped")),
    ...                          io.StringIO(shard.format("skipped", "failed"))])
    >>> {name: record[0] for name, record in specs.items()}
    {'a': 'passed', 'b': 'failed'}
    """
    specs, suite_failures = {}, []
    for path in paths:
        shard_specs, failures = read_report(path)
        shard = os.path.basename(os.path.dirname(path)) if isinstance(path, str) and len(paths) > 1 else ""
        suite_failures += [(f"{shard}: {raw}" if shard else raw, text) for raw, text in failures]
        for name, record in shard_specs.items():
            if name not in specs or record_rank(record) > record_rank(specs[name]):
                specs[name] = record
    return specs, suite_failures


def classify(specs, focus, skip):
    """Selected specs: {name: 'passed'|'failed'|'skipped'|'not run'|'not reached'}.

    >>> not_selected = ("skipped", "skipped", "", 0)
    >>> specs = {"a [NodeConformance]": ("passed", "", "", 1), "b [NodeConformance] [Slow]": not_selected,
    ...          "c [NodeConformance]": ("skipped", "skipped - no GPU", "", 0), "d": not_selected,
    ...          "e [NodeConformance]": not_selected, "f [NodeConformance]": ("failed", "", "x", 2)}
    >>> for name, result in classify(specs, NC, r"\\[Slow\\]").items():
    ...     print(f"{name}: {result}")
    a [NodeConformance]: passed
    b [NodeConformance] [Slow]: not run
    c [NodeConformance]: skipped
    e [NodeConformance]: not reached
    f [NodeConformance]: failed
    """
    focus_re = re.compile(focus)
    skip_re = re.compile(skip) if skip else None
    out = {}
    for name, (state, skip_msg, _, _) in specs.items():
        if not focus_re.search(name):
            continue
        if state == "passed":
            out[name] = "passed"
        elif state == "interrupted":
            # Running when the run was interrupted: it never finished.
            out[name] = "not reached"
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


def read_expect(path):
    """The regular expressions of an --expect file."""
    patterns = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                re.compile(line)
            except re.error as e:
                sys.exit(f"conformance-table: {path}:{number}: not a regular expression ({e}): {line}")
            patterns.append(line)
    return patterns


def missing_expected(patterns, results):
    """The patterns that match no selected test that ran.

    >>> missing_expected(["Pods should", "gone"], {"Pods should run": "passed", "gone away": "not run"})
    ['gone']
    """
    ran = [name for name, result in results.items() if result in ("passed", "failed")]
    return [p for p in patterns if not any(re.search(p, name) for name in ran)]


# A kept failure text is cut to this many characters: the cause is in its
# first lines (`shorten`, `cause_of`), the rest is object dumps.
KEPT_FAILURE_CHARS = 16384


def compact_report(source, focus):
    """The part of one JUnit report the table reads, as a new XML tree: the
    specs the run's focus selects (name, status, time, skip message, failure
    text cut to KEPT_FAILURE_CHARS) and the suite-level entries that failed;
    of a spec's log only the lines `failure_text` looks for (LOG_MARKERS).
    The specs a focus does not select (every other spec of the suite, which
    a report lists as skipped) and the logs are left out: a kept report is
    a few kilobytes where the full one is megabytes, and reads the same.

    >>> report = ('<testsuites><testsuite><testcase name="[BeforeSuite]" status="passed"/>'
    ...           '<testcase name="[It] a [NodeConformance]" status="failed" time="2">'
    ...           '<failure message="m">boom</failure><system-err>unable to upgrade connection: 404'
    ...           '</system-err></testcase><testcase name="[It] b" status="skipped"><skipped message="skipped"/>'
    ...           '</testcase></testsuite></testsuites>')
    >>> kept = compact_report(io.StringIO(report), NC)
    >>> [tc.get("name") for tc in kept.iter("testcase")]
    ['[It] a [NodeConformance]']
    >>> full, small = read_report(io.StringIO(report))[0], read_report(io.BytesIO(ET.tostring(kept)))[0]
    >>> small["a [NodeConformance]"] == full["a [NodeConformance]"], classify(small, NC, "") == classify(full, NC, "")
    (True, True)
    """
    focus_re = re.compile(focus)
    suite = ET.Element("testsuite")
    for tc in ET.parse(open_report(source)).iter("testcase"):
        raw, state = tc.get("name", ""), tc.get("status", "")
        if raw.startswith("[It]"):
            if not focus_re.search(spec_name(tc)):
                continue
        elif state not in FAILED_STATES:
            continue
        out = ET.SubElement(suite, "testcase", {k: tc.get(k) for k in ("name", "status", "time") if tc.get(k)})
        skipped = tc.find("skipped")
        if skipped is not None:
            ET.SubElement(out, "skipped", {"message": skipped.get("message", "")})
        for tag in ("failure", "error"):
            el = tc.find(tag)
            if el is not None:
                kept = ET.SubElement(out, tag, {"message": (el.get("message") or "")[:KEPT_FAILURE_CHARS]})
                kept.text = (el.text or "")[:KEPT_FAILURE_CHARS]
        log = tc.findtext("system-err") or ""
        markers = [line for line, _ in LOG_MARKERS if line in log]
        if markers:
            ET.SubElement(out, "system-err").text = "\n".join(markers)
    root = ET.Element("testsuites")
    root.append(suite)
    return root


def cmd_keep(args):
    tree = ET.ElementTree(compact_report(args.junit, args.focus))
    tmp = args.out + ".tmp"
    # mtime=0: the same report kept twice gives the same bytes.
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        tree.write(f, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, args.out)


def cmd_summary(args):
    expected = read_expect(args.expect) if args.expect else []
    specs, suite_failures = read_reports(args.junit)
    results = classify(specs, args.focus, args.skip)
    counts = collections.Counter(results.values())
    for raw, text in suite_failures:
        print(f"SUITE {raw}: {shorten(text)}")
    for name in sorted(n for n, r in results.items() if r == "failed"):
        print(f"FAILED {name}: {cause_of(specs[name][2])}")
    skipped = counts["skipped"] + counts["not run"] + counts["not reached"]
    if counts["not reached"]:
        print(f"NOT REACHED {counts['not reached']} selected tests: the run was cut short")
    missing = missing_expected(expected, results)
    for pattern in missing:
        print(f"MISSING {pattern}")
    print(f"{counts['passed']} passed, {counts['failed']} failed, {skipped} skipped")
    if missing:
        sys.exit(1)


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


# Metrics cAdvisor derives from a cgroup's block I/O accounting (blkio
# io_service_bytes and io_serviced), which this machine's kernel leaves at 0.
BLOCK_IO_METRICS = {
    "container_fs_reads_total",
    "container_fs_writes_total",
    "container_fs_reads_bytes_total",
    "container_fs_writes_bytes_total",
    "container_blkio_device_usage_total",
}
BLOCK_IO_REASON = (
    "wants each container's block I/O metrics (container_fs_reads_bytes_total, "
    "container_fs_writes_bytes_total, container_blkio_device_usage_total, ...), which cAdvisor "
    "derives from the cgroup's blkio accounting; this machine's kernel accounts no block I/O to "
    "cgroups (blkio.throttle.io_service_bytes stays at Total 0 after direct writes)"
)


def block_io_only(text):
    r"""True when `text` is a metrics match failure whose every missing metric
    is a block I/O one (BLOCK_IO_METRICS).

    >>> block_io_only('Expected\n    <string>: KubeletMetrics\nto match keys: {\n'
    ...     '[."container_fs_reads_total":\n\tmissing expected element a::b::c]\n'
    ...     'missing expected key container_blkio_device_usage_total\n}')
    True
    >>> block_io_only('Expected\n    <string>: KubeletMetrics\nto match keys: {\n'
    ...     'missing expected key container_blkio_device_usage_total\n'
    ...     'missing expected key container_memory_rss\n}')
    False
    >>> block_io_only('<string>: KubeletMetrics\nto match keys: {\nmissing expected key machine_memory_bytes\n'
    ...     'missing expected key container_fs_reads_total\n}')
    False
    """
    if not re.search(r"<string>: KubeletMetrics\s+to match keys", text):
        return False
    named = re.findall(r'missing expected key (\w+)|\."(\w+)":', text)
    named = [key or element for key, element in named]
    return bool(named) and set(named) <= BLOCK_IO_METRICS


SUMMARY_REASON = (
    "wants pressure stall (PSI) stats of each container, which cgroup v1 does not keep per cgroup "
    "(this machine is cgroup v1), and the kubelet, runtime and misc system containers, which an "
    "agent reports for the cgroups it is told to keep them in (--kubelet-cgroups, --runtime-cgroups, "
    "--system-cgroups); this machine has no systemd to give them, and the local cluster names none"
)
SUMMARY_SYSTEM_CONTAINERS = {"kubelet", "runtime", "misc"}


def summary_psi_only(text):
    r"""True when `text` is a stats summary match failure whose every
    mismatched field is a PSI one and whose every missing element is a
    system container of SUMMARY_SYSTEM_CONTAINERS.

    >>> summary_psi_only('Expected\n    <string>: Summary\nto match fields: {\n'
    ...     '[.Node.SystemContainers:\n\tmissing expected element misc]\n'
    ...     '[.Pods[a::b].Containers[c].CPU:\n\tExpected\n\t    <string>: CPUStats\n'
    ...     '\tto match fields: {\n\t.PSI:\n\t\tExpected\n\t\t    <*v1alpha1.PSIStats | 0x0>: nil\n}')
    True
    >>> summary_psi_only('Expected\n    <string>: Summary\nto match fields: {\n'
    ...     '[.Pods[a::b].CPU:\n\tExpected\n\t    <string>: CPUStats\n\tto match fields: {\n'
    ...     '\t.UsageNanoCores:\n\t\tExpected\n\t\t    <uint64>: 0\n}')
    False
    """
    if not re.search(r"<string>: Summary\s+to match fields", text) or "unexpected element" in text:
        return False
    leaves = [field for field, kind in re.findall(r"\.(\w+):\s*Expected\s*<([^>]*)>", text)
              if kind != "string"]
    missing = set(re.findall(r"missing expected element ([^\s,\]]+)", text))
    return (bool(leaves) or bool(missing)) and all(f == "PSI" for f in leaves) \
        and missing <= SUMMARY_SYSTEM_CONTAINERS


def machine_reason(name, text=""):
    """The reason this machine fails test `name`, from its name
    (MACHINE_REASONS) or from its failure `text` (MACHINE_TEXT_REASONS, and
    metrics missing only for block I/O); None when the failure is the agent's.

    >>> machine_reason("t", "oom_score_adj value 0 not equal to expected -997 for container c1 in pod p").split(";")[0]
    "checks a container's oom_score_adj, negative for a Guaranteed pod (-997) or the node's critical pods"
    >>> machine_reason("t", "oom_score_adj value 5 not equal to expected 1000 for container c1 in pod p") is None
    True
    """
    for pattern, reason in MACHINE_REASONS:
        if re.search(pattern, name):
            return reason
    for pattern, reason in MACHINE_TEXT_REASONS:
        if text and re.search(pattern, text):
            return reason
    if text and block_io_only(text):
        return BLOCK_IO_REASON
    if text and summary_psi_only(text):
        return SUMMARY_REASON
    return None


def run_machine_reason(runs, name):
    """machine_reason for a test that failed in one of `runs` (None entries allowed)."""
    for run in runs:
        if run and run.results.get(name) == "failed":
            reason = machine_reason(name, run.specs[name][2])
            if reason:
                return reason
    return machine_reason(name)


def capability(name):
    """What the test exercises, from CAPABILITIES, or "other".

    >>> capability("[sig-node] MirrorPod when create a mirror pod should be updated when static pod updated")
    'static pods and mirror pods (issue: static pods)'
    >>> capability("[sig-node] Swap [LinuxOnly] [Feature:NodeSwap] with configuration QOS Burstable")
    'swap'
    >>> capability("[sig-node] Something new")
    'other'
    """
    for pattern, what in CAPABILITIES:
        if re.search(pattern, name):
            return what
    return "other"


def kubelet_note(name):
    return next((note for pattern, note in KUBELET_NOTES if re.search(pattern, name)), None)


def alternatives(pattern):
    r"""The top-level alternatives of a regular expression.

    >>> alternatives(r"\[Slow\]|\[Disruptive\]|a(b|c)|[|]x")
    ['\\[Slow\\]', '\\[Disruptive\\]', 'a(b|c)', '[|]x']
    """
    out, current, depth, in_class, i = [], "", 0, False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            current += pattern[i : i + 2]
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            out.append(current)
            current = ""
            i += 1
            continue
        current += ch
        i += 1
    out.append(current)
    return [a for a in out if a]


def skip_label(name, skip):
    r"""What excluded a not-run test: the tag of the first alternative of the
    skip pattern that matches it ("[Slow]"), or that alternative itself.

    >>> skip_label("x [NodeConformance] [Slow] [Disruptive]", r"\[Slow\]|\[Disruptive\]")
    '[Slow]'
    >>> skip_label("should be able to pull image [NodeConformance]", r"\[Slow\]|pull image")
    'pull image'
    """
    for alt in alternatives(skip):
        if re.search(alt, name):
            m = re.fullmatch(r"\\\[([\w:.-]+)\\\]", alt)
            return f"[{m.group(1)}]" if m else alt
    return skip


@dataclasses.dataclass
class Run:
    """One agent's results of one result set."""

    set: str
    agent: str
    info: dict
    specs: dict
    results: dict
    suite_failures: list = dataclasses.field(default_factory=list)
    reports: int = 0

    def count(self, what):
        return sum(1 for r in self.results.values() if r == what)

    def ran(self):
        return self.count("passed") + self.count("failed")

    def failed(self):
        return sorted(n for n, r in self.results.items() if r == "failed")

    def machine_failures(self):
        return [n for n in self.failed() if machine_reason(n, self.specs[n][2])]


RESULT_RANK = {"failed": 5, "passed": 4, "skipped": 3, "not reached": 2, "not run": 1}


def union(name, a, b):
    """The derived run of two disjoint sets: each test's result from the set
    that ran it (failed first, should both have run it), else the set where it
    skipped itself, else not reached, else not run.

    >>> e2e = Run("e2e", "rustlet", {}, {}, {"a": "passed", "s": "not run", "x": "not run"})
    >>> slow = Run("e2e-slow", "rustlet", {}, {}, {"s": "failed", "x": "not run"})
    >>> union("e2e+slow", e2e, slow).results
    {'a': 'passed', 's': 'failed', 'x': 'not run'}
    """
    results, specs = dict(a.results), dict(a.specs)
    for test, result in b.results.items():
        if test not in results or RESULT_RANK[result] > RESULT_RANK[results[test]]:
            results[test] = result
            specs[test] = b.specs.get(test)
    return Run(name, a.agent, {}, specs, results)


def shard_reports(directory):
    """A run's JUnit reports: shard-<k>/junit_01.xml in shard order (or a
    junit_01.xml of its own); each may be the kept, gzipped form
    (junit_01.xml.gz, see `keep`)."""
    paths = []
    for name in ("junit_01.xml", "junit_01.xml.gz"):
        paths += glob.glob(os.path.join(directory, "shard-*", name))
    paths.sort(key=lambda p: int(re.sub(r"\D", "", os.path.basename(os.path.dirname(p))) or 0))
    return paths or glob.glob(os.path.join(directory, "junit_01.xml*"))


def load_run(base, set_name, agent):
    directory = os.path.join(base, set_name, agent)
    paths = shard_reports(directory)
    if not paths:
        return None
    info = read_summary(os.path.join(directory, "summary.txt"))
    specs, suite_failures = read_reports(paths)
    results = classify(specs, info.get("focus") or NC, info.get("skip", ""))
    return Run(set_name, agent, info, specs, results, suite_failures, len(paths))


def cell(result):
    return {"passed": "pass", "failed": "**FAIL**", "skipped": "skip", "not run": "–", "not reached": "n/r",
            None: "·"}[result]


def minutes(duration):
    """'1532.3s' as '26 min'; anything else as it is.

    >>> minutes("1532.3s"), minutes("12.0s (interrupted)"), minutes("?")
    ('26 min', '0 min (interrupted)', '?')
    """
    m = re.match(r"([0-9.]+)s\b(.*)", duration)
    return f"{float(m.group(1)) / 60:.0f} min{m.group(2)}" if m else duration


def percent(part, whole):
    """A share that shows 100% only when it is whole.

    >>> percent(243, 245), percent(2449, 2450), percent(5, 5), percent(0, 0)
    ('99.1%', '99.9%', '100%', 'n/a')
    """
    if not whole:
        return "n/a"
    if part == whole:
        return "100%"
    return f"{math.floor(1000 * part / whole) / 10:.1f}%"


def md(s):
    r"""Text for a Markdown table cell (a '|' already escaped stays as it is).

    >>> md("a|b \\| <nil>")
    'a\\|b \\| &lt;nil>'
    """
    return re.sub(r"(?<!\\)\|", r"\\|", s).replace("<", "&lt;")


def code(s, in_table=False):
    """A regular expression as inline code."""
    if not s:
        return "(none)"
    return "`" + (s.replace("|", "\\|") if in_table else s) + "`"


class Sitting:
    """Every run found under the base directory, and the derived union."""

    def __init__(self, base):
        self.runs = {}
        for set_name, _, _ in SETS:
            for agent in AGENTS:
                run = load_run(base, set_name, agent)
                if run is not None:
                    self.runs[set_name, agent] = run
        for agent in AGENTS:
            if ("e2e", agent) not in self.runs:
                sys.exit(f"conformance-table: no JUnit report under {os.path.join(base, 'e2e', agent)} "
                         f"(run hack/conformance.sh --suite e2e --agent {agent})")
        self.union_name, self.union_title, (self.first, self.second) = UNION
        for agent in AGENTS:
            if (self.first, agent) in self.runs and (self.second, agent) in self.runs:
                self.runs[self.union_name, agent] = union(
                    self.union_name, self.runs[self.first, agent], self.runs[self.second, agent])
        self.titles = {name: title for name, title, _ in SETS} | {self.union_name: self.union_title}
        # The sets with results, in SETS order; the union right after its two parts.
        self.sets = [name for name, _, _ in SETS if any((name, a) in self.runs for a in AGENTS)]
        order = [name for name, _, _ in SETS]
        order.insert(order.index(self.second) + 1, self.union_name)
        self.order = order
        self.measured = [(s, a) for s in order for a in AGENTS if (s, a) in self.runs]
        self.real_runs = [self.runs[k] for k in self.measured if k[0] != self.union_name]

    def get(self, set_name, agent):
        return self.runs.get((set_name, agent))


def headline(run):
    """'passed / run (share)' and the number of those failures the machine causes."""
    if run is None:
        return "not run", ""
    passed, ran = run.count("passed"), run.ran()
    text = f"{passed} / {ran} ({percent(passed, ran)})"
    # A run still going (or stopped, to be resumed) has no summary yet: its
    # figures cover the shards that finished, and the rest is not reached.
    if not run.info.get("date") and run.count("not reached"):
        text += f", unfinished: {run.count('not reached')} not reached yet"
    return text, str(len(run.machine_failures()))


def section_header(s):
    dates = sorted(r.info["date"] for r in s.real_runs if r.info.get("date"))
    sitting = f"between {dates[0]} and {dates[-1]}" if dates else "at times not recorded"
    versions = sorted({r.info.get("kubernetes", "?").split(" ")[0] for r in s.real_runs})
    ginkgos = sorted({r.info.get("ginkgo", "?") for r in s.real_runs})
    yield "# Node conformance: rustlet and the upstream kubelet"
    yield ""
    yield ("Generated by `hack/conformance-table.py table` from the runs of "
           "`hack/conformance.sh --suite <set> --agent <agent>` (`<agent>` kubelet or rustlet), which write "
           "`_output/conformance/<set>/<agent>/`; `hack/conformance-sitting.sh` keeps each run's results "
           "(its summary and the selected tests of its JUnit reports) in `docs/conformance/<set>/<agent>/`, "
           "from which this page can be made again. Do not edit by hand: rerun the suites and the script.")
    yield ""
    one = len({r.info.get("binaries", "not recorded") for r in s.real_runs}) == 1
    yield (f"{'One sitting: the' if one else 'The'} runs started {sitting}. Kubernetes {', '.join(versions)} (the test binaries, "
           f"the control plane and the kubelet), ginkgo {', '.join(ginkgos)}, on the local one-node cluster "
           "(`hack/local-up.sh`): containerd 2 with runc and bridge CNI, images built locally "
           "(`hack/images.sh`), no cluster DNS, no kube-proxy, no network beyond this machine.")
    yield ""
    yield from binaries_line(s.real_runs)
    yield ""
    yield "Result sets:"
    yield ""
    for name, _, what in SETS:
        absent = "" if name in s.sets else " Not run in this sitting."
        yield f"- `{name}`: {what}.{absent}"
    yield (f"- `{s.first}` + `{s.second}`, \"{s.union_title}\": derived, the union of the two. Both are from "
           f"this sitting and their tests do not overlap (`{s.first}` skips `[Slow]`, `{s.second}` runs only "
           "`[Slow]`), so together they are every `[NodeConformance]` test of e2e.test that is run.")
    yield ""


def binaries_line(runs):
    """What the runs ran: one digest of the upstream binaries and one rustlet
    binary for all of them; else, when each result set's runs (kubelet and
    rustlet) share theirs, the sets of each digest; else a warning naming
    each run's."""
    ids = sorted({r.info.get("binaries", "not recorded") for r in runs})
    rustlets = sorted({r.info["rustlet"] for r in runs if r.info.get("rustlet")})
    if len(ids) == 1 and len(rustlets) <= 1:
        who = f" and the same rustlet binary, built from {rustlets[0]}" if rustlets else ""
        yield (f"Every run used the same upstream binaries (digest `{ids[0]}` of `_output/bin`, "
               f"`binaries_id` in `hack/lib.sh`){who}.")
        return
    by_set = {}
    for r in runs:
        by_set.setdefault(r.set, []).append(r)
    if all(len({x.info.get("binaries", "not recorded") for x in rs}) == 1 for rs in by_set.values()):
        yield ("Not one set of binaries for every result set, but within each result set both agents "
               "ran the same upstream binaries (digest of `_output/bin`, `binaries_id` in `hack/lib.sh`):")
        yield ""
        groups = {}
        for name, rs in by_set.items():
            groups.setdefault(rs[0].info.get("binaries", "not recorded"), []).append((name, rs))
        for digest, members in groups.items():
            names = ", ".join(f"`{name}`" for name, _ in members)
            dates = sorted({x.info.get("date", "")[:10] for _, rs in members for x in rs if x.info.get("date")})
            built = sorted({x.info["rustlet"] for _, rs in members for x in rs if x.info.get("rustlet")})
            yield (f"- `{digest}`: {names}" + (f", run {' to '.join([dates[0], dates[-1]]) if len(dates) > 1 else dates[0]}" if dates else "")
                   + (f"; rustlet built from {', '.join(built)}" if built else ""))
        return
    yield "**Not one set of binaries**: the runs differ in what they ran."
    yield ""
    for r in runs:
        yield (f"- `{r.set}` with {r.agent}: binaries `{r.info.get('binaries', 'not recorded')}`"
               + (f", rustlet {r.info['rustlet']}" if r.info.get("rustlet") else ""))


def section_headline(s):
    yield "## Headline"
    yield ""
    yield ("Passed of the tests that ran. Every failure stays in the denominator, including those this "
           "machine causes: the \"machine\" columns count them (they are listed under "
           "[Failures this machine causes](#failures-this-machine-causes)).")
    yield ""
    yield "| result set | kubelet: passed / run | machine | rustlet: passed / run | machine |"
    yield "| --- | ---: | ---: | ---: | ---: |"
    for set_name in s.order:
        cells = [c for agent in AGENTS for c in headline(s.get(set_name, agent))]
        which = f"`{s.first}` + `{s.second}`" if set_name == s.union_name else f"`{set_name}`"
        yield f"| {md(s.titles[set_name])} ({which}) | " + " | ".join(cells) + " |"
    yield ""


def section_totals(s):
    yield "## Totals"
    yield ""
    yield "Tests in the set = run + skipped by the test itself + not run + not reached; run = passed + failed."
    yield ""
    yield ("| set | agent | tests in the set | run | passed | failed | of which the machine's | "
           "skipped by the test itself | not run (`--skip`) | not reached |")
    yield "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for set_name, agent in s.measured:
        run = s.get(set_name, agent)
        yield (f"| `{set_name}` | {agent} | {len(run.results)} | {run.ran()} | {run.count('passed')} | "
               f"{run.count('failed')} | {len(run.machine_failures())} | {run.count('skipped')} | "
               f"{run.count('not run')} | {run.count('not reached')} |")
    yield ""
    yield ("Not reached: selected and not skipped, yet never run, because the run was cut short (its time "
           "limit, an interrupt) before it.")
    yield ""


def section_runs(s):
    yield "## The runs"
    yield ""
    yield "| set | agent | suite | started | tests ran for | cluster up in | procs | shards | commit |"
    yield "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"
    for run in s.real_runs:
        i = run.info
        shards = i.get("shards", "?")
        if shards.isdigit() and int(shards) != run.reports:
            print(f"conformance-table: {run.set}/{run.agent}: {run.reports} shard reports of {shards}; the "
                  "missing shards' tests count as not reached", file=sys.stderr)
            shards = f"{run.reports} of {shards} reports"
        yield (f"| `{run.set}` | {run.agent} | {i.get('suite', '?')} | {i.get('date', '?')} | "
               f"{minutes(i.get('e2e run', '?'))} | {i.get('cluster up', '?')} | {i.get('procs', '?')} | "
               f"{shards} | {md(i.get('rustlet', '–'))} |")
    yield ""
    yield ("Commit: the rustlet source the run built. Each run's focus and skip are under "
           "[What is not run, and why](#what-is-not-run-and-why).")
    yield ""
    for run in s.real_runs:
        if run.suite_failures:
            yield (f"Suite-level failures of `{run.set}` with {run.agent}: "
                   + "; ".join(f"`{raw}`: {shorten(text)}" for raw, text in run.suite_failures))
            yield ""


def section_not_run(s):
    yield "## What is not run, and why"
    yield ""
    yield ("Each run selects the tests its focus matches and leaves out those its skip matches (\"not run\"). "
           "`[Serial]` tests run, one at a time after the others. The count of not-run tests is by the first "
           "part of the skip pattern that excludes each. The `[Slow]` tests that `e2e` leaves out are the "
           "`e2e-slow` set.")
    yield ""
    yield "| set | agent | focus | skip | not run | " + " | ".join(SKIP_TAGS) + " | other |"
    yield "| --- | --- | --- | --- | ---: | " + " | ".join("---:" for _ in SKIP_TAGS) + " | ---: |"
    others = []
    for run in s.real_runs:
        skip = run.info.get("skip", "")
        labels = collections.Counter(skip_label(n, skip) for n, r in run.results.items() if r == "not run")
        other = {label: k for label, k in labels.items() if label not in SKIP_TAGS}
        others += [(run, label, k) for label, k in sorted(other.items())]
        focus = run.info.get("focus") or NC
        if len(focus) > 100:
            focus = focus[:99] + "…"
        yield (f"| `{run.set}` | {run.agent} | {code(focus, True)} | {code(skip, True)} | "
               f"{run.count('not run')} | " + " | ".join(str(labels[t]) for t in SKIP_TAGS)
               + f" | {sum(other.values())} |")
    yield ""
    for run, label, k in others:
        yield f"- `{run.set}`, {run.agent}: {k} not run for the skip pattern's {code(label)}."
    if others:
        yield ""
    reasons = [(run, collections.Counter(shorten(run.specs[n][1].removeprefix("skipped - "), 120)
                                         for n, r in run.results.items() if r == "skipped"))
               for run in s.real_runs]
    if any(counts for _, counts in reasons):
        yield "Tests that skipped themselves (a requirement the node or the run lacks), by the reason they give:"
        yield ""
        yield "| set | agent | reason | tests |"
        yield "| --- | --- | --- | ---: |"
        for run, counts in reasons:
            for reason, k in counts.most_common():
                yield f"| `{run.set}` | {run.agent} | {md(reason)} | {k} |"
        yield ""


def section_machine(s):
    yield "## Failures this machine causes"
    yield ""
    rows = []
    for set_name in s.sets:
        pair = [s.get(set_name, a) for a in AGENTS]
        for n in sorted({n for run in pair if run for n in run.machine_failures()}):
            cells = " | ".join(cell(run.results.get(n) if run else None) for run in pair)
            rows.append(f"| {md(n)} | `{set_name}` | {run_machine_reason(pair, n)} | {cells} |")
    if not rows:
        yield "None in this sitting."
        yield ""
        return
    yield "Listed for whichever agent fails them; they count as run and failed."
    yield ""
    yield "| test | set | reason | kubelet | rustlet |"
    yield "| --- | --- | --- | --- | --- |"
    yield from rows
    yield ""


def failure_cause(name, kub, rus):
    """The cause shown for a failed test: the machine's reason, else rustlet's failure, else the kubelet's."""
    if run_machine_reason((kub, rus), name):
        return "this machine (see above)"
    if rus and rus.results.get(name) == "failed":
        return md(cause_of(rus.specs[name][2]))
    return "kubelet: " + md(kubelet_note(name) or cause_of(kub.specs[name][2]))


def by_capability(names):
    return sorted(names, key=lambda n: (capability(n), n))


def section_compare(s, set_name):
    kub, rus = s.get(set_name, "kubelet"), s.get(set_name, "rustlet")
    pair = [run for run in (kub, rus) if run]
    yield f"### `{set_name}`: {md(s.titles[set_name])}"
    yield ""
    gaps, reverse = [], []
    if kub is None or rus is None:
        yield f"No {'kubelet' if kub is None else 'rustlet'} run of this set in this sitting: nothing to compare."
        yield ""
    else:
        gaps = [n for n in rus.failed() if kub.results.get(n) == "passed"]
        reverse = [n for n in kub.failed() if rus.results.get(n) == "passed"]
        yield f"**Fails with rustlet, passes with the kubelet: {len(gaps)}**"
        yield ""
        if gaps:
            yield "| test | capability | rustlet's failure |"
            yield "| --- | --- | --- |"
            for n in by_capability(gaps):
                doubt = " (listed as this machine's, yet the kubelet passes it)" if machine_reason(n, rus.specs[n][2]) else ""
                yield f"| {md(n)} | {capability(n)} | {md(cause_of(rus.specs[n][2]))}{doubt} |"
            yield ""
        yield f"**Fails with the kubelet, passes with rustlet: {len(reverse)}**"
        yield ""
        if reverse:
            yield "| test | capability | the kubelet's failure |"
            yield "| --- | --- | --- |"
            for n in by_capability(reverse):
                yield f"| {md(n)} | {capability(n)} | {md(kubelet_note(n) or cause_of(kub.specs[n][2]))} |"
            yield ""
    rest = {n for run in pair for n in run.failed()} - set(gaps) - set(reverse)
    if rest:
        yield f"Other failures: {len(rest)} (with both agents, or with one while the other did not run the test)"
        yield ""
        yield "| test | capability | kubelet | rustlet | cause |"
        yield "| --- | --- | --- | --- | --- |"
        for n in by_capability(rest):
            cells = " | ".join(cell(run.results.get(n) if run else None) for run in (kub, rus))
            yield f"| {md(n)} | {capability(n)} | {cells} | {failure_cause(n, kub, rus)} |"
        yield ""

    yield f"Failures of `{set_name}` by capability:"
    yield ""
    # {capability: {agent: [run, failed]}}
    tally = collections.defaultdict(lambda: {a: [0, 0] for a in AGENTS})
    for run in pair:
        for n, r in run.results.items():
            if r in ("passed", "failed"):
                tally[capability(n)][run.agent][0] += 1
                tally[capability(n)][run.agent][1] += r == "failed"
    failing = {c: t for c, t in tally.items() if any(t[a][1] for a in AGENTS)}
    if failing:
        yield "| capability | kubelet: failed / run | rustlet: failed / run |"
        yield "| --- | ---: | ---: |"
        for c, t in sorted(failing.items(), key=lambda kv: (-kv[1]["rustlet"][1], -kv[1]["kubelet"][1], kv[0])):
            cells = " | ".join(f"{t[a][1]} / {t[a][0]}" if s.get(set_name, a) else "–" for a in AGENTS)
            yield f"| {c} | {cells} |"
    else:
        yield "None."
    yield ""

    yield (f"Failures of `{set_name}` by cause (where no known cause matches, the first lines of the failure "
           "message, shortened):")
    yield ""
    causes = {a: collections.Counter() for a in AGENTS}
    example = {}
    for run in pair:
        for n in run.failed():
            c = cause_of(run.specs[n][2])
            causes[run.agent][normalize(c)] += 1
            example.setdefault(normalize(c), c)
    if example:
        yield "| cause | kubelet | rustlet |"
        yield "| --- | ---: | ---: |"
        for k in sorted(example, key=lambda k: (-causes["rustlet"][k], -causes["kubelet"][k], k)):
            cells = " | ".join(str(causes[a][k]) if s.get(set_name, a) else "–" for a in AGENTS)
            yield f"| {md(example[k])} | {cells} |"
    else:
        yield "None."
    yield ""


def section_images(_s):
    yield "## Images"
    yield ""
    yield ("Built by `hack/images.sh` under the names of test/utils/image/manifest.go: pause, busybox, agnhost "
           "(also as the previous agnhost), nonroot, nonewprivs, nginx, perl, glibc-dns-testing. Not built:")
    yield ""
    for image, why in UNBUILDABLE_IMAGES:
        yield f"- {image}: {why}."
    for note in IMAGE_NOTES:
        yield f"- {note}"
    yield ""


def section_all_tests(s):
    yield "## All tests"
    yield ""
    yield ("`pass`, **FAIL**, `skip` (the test skipped itself), `–` (not run: `--skip`), `n/r` (not reached: "
           "the run was cut short before it), `·` (no run of this set with that agent). Cause: this machine "
           "(see above), else rustlet's failure, else the kubelet's.")
    yield ""
    for set_name in s.sets:
        kub, rus = s.get(set_name, "kubelet"), s.get(set_name, "rustlet")
        names = sorted({n for run in (kub, rus) if run for n in run.results})
        yield f"<details><summary><code>{set_name}</code>: {len(names)} tests</summary>"
        yield ""
        yield "| test | kubelet | rustlet | cause |"
        yield "| --- | --- | --- | --- |"
        for n in names:
            k = kub.results.get(n) if kub else None
            r = rus.results.get(n) if rus else None
            why = failure_cause(n, kub, rus) if "failed" in (k, r) else ""
            yield f"| {md(n)} | {cell(k)} | {cell(r)} | {why} |"
        yield ""
        yield "</details>"
        yield ""


def cmd_table(args):
    s = Sitting(args.base or os.path.join(ROOT, "_output", "conformance"))
    lines = [*section_header(s), *section_headline(s), *section_totals(s), *section_runs(s),
             *section_not_run(s), *section_machine(s)]
    lines += ["## Rustlet and the kubelet compared", "",
              "Per result set: the tests that fail with rustlet and pass with the kubelet (each a gap to close, "
              "or to name), the reverse, and the other failures. Capability: what the test exercises, where its "
              "name makes it obvious.", ""]
    for set_name in s.sets:
        lines += section_compare(s, set_name)
    lines += [*section_images(s), *section_all_tests(s)]
    path = args.out or os.path.join(ROOT, "docs", "conformance.md")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"conformance-table: wrote {path}: " + "; ".join(
        f"{set_name} {agent} {headline(s.get(set_name, agent))[0]}" for set_name, agent in s.measured))


def cmd_selftest(_args):
    failures, tests = doctest.testmod(sys.modules[__name__])
    print(f"conformance-table selftest: {tests - failures} of {tests} examples passed")
    sys.exit(1 if failures else 0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary", help="counts of one run (its shards' reports merged)")
    s.add_argument("--focus", default=NC)
    s.add_argument("--skip", default="")
    s.add_argument("--expect", metavar="FILE",
                   help="regular expressions, one a line, each of which must match a test that ran")
    s.add_argument("junit", nargs="+")
    k = sub.add_parser("keep", help="the part of a JUnit report the table reads, gzipped")
    k.add_argument("--focus", default=NC, help="the run's focus: the specs to keep")
    k.add_argument("junit")
    k.add_argument("out", help="the kept report (.xml.gz)")
    t = sub.add_parser("table", help="write docs/conformance.md")
    t.add_argument("--out", help="the document (default docs/conformance.md)")
    t.add_argument("--base", help="directory holding <set>/<agent>/ (default _output/conformance)")
    sub.add_parser("selftest", help="run this file's examples")
    args = p.parse_args()
    {"summary": cmd_summary, "keep": cmd_keep, "table": cmd_table, "selftest": cmd_selftest}[args.cmd](args)


if __name__ == "__main__":
    main()
