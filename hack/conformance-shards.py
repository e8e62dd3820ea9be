#!/usr/bin/env python3
"""Splits the tests a ginkgo run selects into shards, for hack/conformance.sh.

  hack/conformance-shards.py REPORT N OUTDIR
  hack/conformance-shards.py selftest

REPORT is the JSON report of a dry run (`--ginkgo.dry-run
--ginkgo.json-report=REPORT` with the run's focus and skip): the selected
tests are its `It` specs whose state is "passed". Tests of the same container
stay together: an Ordered container's tests share state (a pod made by the
first, checked by the next), and ginkgo runs them in one process only when
they run in one shard. The groups are dealt, in the suite's order, each to
the shard with the fewest tests so far; OUTDIR/shard-<k>.focus gets one regular
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
    """`text` as a regular expression matching it literally, but for its
    spaces: a run of them matches one or more. A container's text may end
    in a space, which the dry run's report keeps (two spaces in the joined
    name) and the name ginkgo matches the focus against does not; an exact
    match skipped such tests without a word.

    >>> print(escape("Pod SIGKILL [LinuxOnly]  The (137)"))
    Pod +SIGKILL +\\[LinuxOnly\\] +The +\\(137\\)
    """
    out, spaces = [], False
    for c in text:
        if c == " ":
            if not spaces:
                out.append(" +")
            spaces = True
            continue
        spaces = False
        out.append("\\" + c if c in META else c)
    return "".join(out)


def selected(report_path):
    """The selected tests' names, grouped by their container, in suite order.

    >>> import tempfile
    >>> spec = lambda c, t: {"LeafNodeType": "It", "State": "passed",
    ...     "ContainerHierarchyTexts": c, "ContainerHierarchyLocations": [{"FileName": "f", "LineNumber": len(c)}],
    ...     "LeafNodeText": t}
    >>> report = [{"SpecReports": [spec(["A", "ordered"], "one"), spec(["B"], "x"),
    ...     spec(["A", "ordered"], "two"), {"LeafNodeType": "It", "State": "skipped"}]}]
    >>> with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    ...     json.dump(report, f)
    >>> selected(f.name)
    [['A ordered one', 'A ordered two'], ['B x']]
    """
    with open(report_path, encoding="utf-8") as f:
        suites = json.load(f)
    groups = {}
    for suite in suites:
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It" or spec.get("State") != "passed":
                continue
            texts = spec.get("ContainerHierarchyTexts") or []
            places = [(loc.get("FileName"), loc.get("LineNumber")) for loc in spec.get("ContainerHierarchyLocations") or []]
            key = json.dumps([texts, places])
            groups.setdefault(key, []).append(" ".join([*texts, spec.get("LeafNodeText", "")]))
    return list(groups.values())


def deal(groups, n):
    """Each group, in order, to the shard with the fewest tests so far.

    >>> deal([["a", "b", "c"], ["d"], ["e"], ["f", "g"]], 2)
    [['a', 'b', 'c'], ['d', 'e', 'f', 'g']]
    """
    shards = [[] for _ in range(n)]
    for g in groups:
        min(shards, key=len).extend(g)
    return shards


def main():
    if sys.argv[1:] == ["selftest"]:
        import doctest

        failed, tried = doctest.testmod()
        print(f"conformance-shards selftest: {tried - failed} of {tried} examples passed")
        sys.exit(1 if failed else 0)
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    report, n, outdir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if n < 1:
        sys.exit("conformance-shards: N must be at least 1")
    groups = selected(report)
    os.makedirs(outdir, exist_ok=True)
    shards = deal(groups, n)
    for k in range(n):
        mine = shards[k]
        with open(os.path.join(outdir, f"shard-{k + 1}.tests"), "w", encoding="utf-8") as f:
            f.writelines(name + "\n" for name in mine)
        with open(os.path.join(outdir, f"shard-{k + 1}.focus"), "w", encoding="utf-8") as f:
            # An empty shard (more shards than tests) matches nothing.
            f.write("(?:" + "|".join(escape(name) for name in mine) + ")$" if mine else "^$^")
    print(sum(len(g) for g in groups))


if __name__ == "__main__":
    main()
