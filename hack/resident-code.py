#!/usr/bin/env python3
"""Which code of a running process is resident, by crate.

    hack/resident-code.py PID [--depth N] [--top N] [--json FILE]
    hack/resident-code.py selftest

Reads the process's executable mappings (/proc/PID/maps), which of their
pages are in memory (/proc/PID/pagemap, bit 63; needs root for other users'
processes) and the executable's symbols (`nm`, demangled), and shares each
resident page's 4096 bytes among the symbols it holds. A symbol counts for
the first crate its name names that is not the standard library's (a
`core::ptr::drop_in_place<hyper::...>` is hyper's code); rustlet's own
symbols count by module, to --depth levels (default 2: `rustlet::pod`).
Prints, largest first, each crate's resident KiB beside the KiB of code it
has in the binary, and the resident bytes no symbol covers (tables, PLT).

The process's resident set counts these pages whoever touched them: the
figure is what a subsystem's code costs the node while the process lives.
"""

import bisect
import json
import re
import struct
import subprocess
import sys
from collections import defaultdict

PAGE = 4096
STD = {"core", "alloc", "std", "compiler_builtins", "hashbrown", "std_detect", "panic_unwind", "gimli", "addr2line", "miniz_oxide", "rustc_demangle"}
CRATE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)::")


def crate_of(name, depth):
    """The crate (and for rustlet its modules, to `depth` levels) a
    demangled symbol name counts for; `?` for a name with no path."""
    # Where a path starts: not right after `::` (a module, not a crate).
    paths = [m.start() for m in CRATE.finditer(name) if name[max(m.start() - 1, 0) : m.start()] != ":"]
    chosen = None
    for start in paths:
        crate = CRATE.match(name, start).group(1)
        if crate not in STD and not crate[0].isupper():
            chosen = start
            break
    if chosen is None:
        if not paths:
            return "?"
        chosen = paths[0]
    parts = []
    at = chosen
    while len(parts) < max(depth, 1):
        m = CRATE.match(name, at)
        if not m:
            break
        parts.append(m.group(1))
        at = m.end()
    if not parts:
        return "?"
    return "::".join(parts) if parts[0] == "rustlet" else parts[0]


def symbols(binary):
    """Text symbols of `binary`: sorted (address, size, name)."""
    out = subprocess.run(
        ["nm", "--defined-only", "-S", "-C", binary],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    syms = []
    for line in out.splitlines():
        fields = line.split(" ", 3)
        if len(fields) < 4 or fields[2] not in ("t", "T", "W", "w"):
            continue
        addr, size = int(fields[0], 16), int(fields[1], 16)
        if size:
            syms.append((addr, size, fields[3]))
    syms.sort()
    return syms


def load_segments(binary):
    """The executable PT_LOAD segments: (offset, vaddr, filesz)."""
    out = subprocess.run(
        ["readelf", "-lW", binary], check=True, capture_output=True, text=True
    ).stdout
    segs = []
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD" and "E" in f[6:-1]:
            segs.append((int(f[1], 16), int(f[2], 16), int(f[4], 16)))
    return segs


def resident_ranges(pid, binary, image):
    """The executable's code pages in memory, as ELF virtual address ranges:
    `binary` is its path as /proc/PID/maps names it, `image` a path to read
    it from (/proc/PID/exe, which holds it even once a rebuild replaced the
    file)."""
    segs = load_segments(image)
    ranges = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pm:
        for line in maps:
            f = line.split()
            if len(f) < 6 or f[5] != binary or "x" not in f[1]:
                continue
            start, end = (int(x, 16) for x in f[0].split("-"))
            file_off = int(f[2], 16)
            seg = next((s for s in segs if s[0] <= file_off + (end - start) and file_off <= s[0] + s[2]), None)
            if seg is None:
                continue
            p_offset, p_vaddr, _ = seg
            pm.seek(start // PAGE * 8)
            data = pm.read((end - start) // PAGE * 8)
            for i, (entry,) in enumerate(struct.iter_unpack("<Q", data)):
                if entry >> 63 & 1:
                    runtime = start + i * PAGE
                    # File offset of the page, then its ELF address.
                    vaddr = runtime - start + file_off - p_offset + p_vaddr
                    ranges.append((vaddr, vaddr + PAGE))
    return ranges


def attribute(ranges, syms, depth):
    """Resident bytes per crate, and the bytes no symbol covers."""
    starts = [s[0] for s in syms]
    per = defaultdict(int)
    uncovered = 0
    for lo, hi in ranges:
        covered = 0
        i = max(bisect.bisect_right(starts, lo) - 1, 0)
        while i < len(syms) and syms[i][0] < hi:
            addr, size, name = syms[i]
            overlap = min(hi, addr + size) - max(lo, addr)
            if overlap > 0:
                per[crate_of(name, depth)] += overlap
                covered += overlap
            i += 1
        uncovered += max(PAGE - covered, 0)
    return per, uncovered


def totals(syms, depth):
    per = defaultdict(int)
    for _, size, name in syms:
        per[crate_of(name, depth)] += size
    return per


def selftest():
    cases = [
        ("rustlet::pod::worker::sync::{{closure}}", 2, "rustlet::pod"),
        ("rustlet::pod::worker::sync", 1, "rustlet"),
        ("core::ptr::drop_in_place<hyper::proto::h1::conn::Conn<T>>", 2, "hyper"),
        ("<kube_client::client::Client as core::clone::Clone>::clone", 2, "kube_client"),
        ("alloc::raw_vec::RawVec<T,A>::grow_one", 2, "alloc"),
        ("memcpy", 2, "?"),
        ("<T as core::any::Any>::type_id", 2, "core"),
    ]
    for name, depth, want in cases:
        got = crate_of(name, depth)
        assert got == want, f"{name}: {got} != {want}"
    syms = [(0x1000, 0x800, "a::f"), (0x1800, 0x1000, "b::g")]
    per, uncovered = attribute([(0x1000, 0x2000), (0x3000, 0x4000)], syms, 2)
    assert dict(per) == {"a": 0x800, "b": 0x800}, dict(per)
    assert uncovered == PAGE, uncovered
    print("resident-code.py selftest: ok")


def main(argv):
    if argv[1:] == ["selftest"]:
        selftest()
        return 0
    args = argv[1:]
    if not args or not args[0].isdigit():
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    pid = int(args[0])
    depth, top, out = 2, 30, None
    rest = args[1:]
    while rest:
        flag = rest.pop(0)
        if flag == "--depth" and rest:
            depth = int(rest.pop(0))
        elif flag == "--top" and rest:
            top = int(rest.pop(0))
        elif flag == "--json" and rest:
            out = rest.pop(0)
        else:
            print(f"resident-code.py: unknown argument {flag}", file=sys.stderr)
            return 2
    binary = subprocess.run(["readlink", f"/proc/{pid}/exe"], check=True, capture_output=True, text=True).stdout.strip()
    # A file replaced while the process runs (a rebuild) is read through
    # /proc/PID/exe; its mappings keep the path without the suffix.
    binary = binary.removesuffix(" (deleted)")
    image = f"/proc/{pid}/exe"
    syms = symbols(image)
    if not syms:
        print(f"resident-code.py: {binary} has no symbols (stripped?)", file=sys.stderr)
        return 1
    ranges = resident_ranges(pid, binary, image)
    per, uncovered = attribute(ranges, syms, depth)
    size = totals(syms, depth)
    resident = len(ranges) * PAGE
    print(f"{binary} (pid {pid}): {resident / 1024:.0f} KiB of code resident of {sum(size.values()) / 1024:.0f} KiB")
    print(f"{'crate':<36} {'resident KiB':>12} {'code KiB':>9}")
    for crate, b in sorted(per.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{crate:<36} {b / 1024:>12.1f} {size[crate] / 1024:>9.1f}")
    print(f"{'(no symbol)':<36} {uncovered / 1024:>12.1f}")
    if out:
        with open(out, "w") as f:
            json.dump({"binary": binary, "pid": pid, "resident_bytes": resident, "uncovered_bytes": uncovered,
                       "crates": {c: {"resident_bytes": per.get(c, 0), "code_bytes": size[c]} for c in size}}, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
