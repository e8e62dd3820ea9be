#!/usr/bin/env python3
"""Splits the tests a ginkgo run selects into shards, for hack/conformance.sh.

  hack/conformance-shards.py REPORT N OUTDIR

REPORT is the JSON report of a dry run (`--ginkgo.dry-run
--ginkgo.json-report=REPORT` with the run's focus and skip): the selected
tests are its `It` specs whose state is "passed". They are dealt round-robin,
in the suite's order, into N shards; OUTDIR/shard-<k>.focus gets one regular
expression (RE2 syntax, for ginkgo's --focus) that matches the full names
of shard k's tests (anchored at the end only: ginkgo's text of a spec may
start with the text of an unnamed container), and OUTDIR/shard-<k>.tests their names, one per
line. Prints the number of selected tests.

A test's full name is ginkgo's spec text: its containers' texts and its own,
joined by spaces (the name JUnit reports show after "[It] ").
"""

import json
import os
import sys

# RE2 metacharacters; everything else in a test name is literal.
META = set("\\.+*?()|[]{}^$")


def escape(text):
    return "".join("\\" + c if c in META else c for c in text)


def selected(report_path):
    with open(report_path, encoding="utf-8") as f:
        suites = json.load(f)
    names = []
    for suite in suites:
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It" or spec.get("State") != "passed":
                continue
            names.append(" ".join([*spec.get("ContainerHierarchyTexts", []), spec.get("LeafNodeText", "")]))
    return names


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    report, n, outdir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if n < 1:
        sys.exit("conformance-shards: N must be at least 1")
    names = selected(report)
    os.makedirs(outdir, exist_ok=True)
    for k in range(n):
        mine = names[k::n]
        with open(os.path.join(outdir, f"shard-{k + 1}.tests"), "w", encoding="utf-8") as f:
            f.writelines(name + "\n" for name in mine)
        with open(os.path.join(outdir, f"shard-{k + 1}.focus"), "w", encoding="utf-8") as f:
            # An empty shard (more shards than tests) matches nothing.
            f.write("(?:" + "|".join(escape(name) for name in mine) + ")$" if mine else "^$^")
    print(len(names))


if __name__ == "__main__":
    main()
