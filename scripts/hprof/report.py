"""Symbolize and summarise an hprof sample file (scripts/hprof/hprof.c): for the sampled thread,
the functions where its wall-clock time went, self (the innermost frame) and inclusive (anywhere
on the stack), as a share of all samples.

Addresses are resolved with the symbol tables (`nm`, static and dynamic) of the binaries named on
the command line, matched to the process's mappings by file name: give the same files the process
ran (an unstripped copy of a binary that ran stripped has the same addresses).

  python3 scripts/hprof/report.py HPROF.txt --lib libmlx.so=PATH [--lib mlex=PATH ...] [--top 40]
      [--under FUNC]   only samples with FUNC (a substring) on the stack
      [--exclude FUNC] without the samples that have FUNC on the stack (repeatable)
"""
import argparse
import bisect
import collections
import os
import re
import subprocess


def segments(path):
    """PT_LOAD segments of an ELF file: [(file offset, vaddr, filesz)]."""
    out = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True).stdout
    segs = []
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            segs.append((int(f[1], 16), int(f[2], 16), int(f[4], 16)))
    return segs


def symbols(path):
    """Sorted function symbols of an ELF file: ([start], [(start, size, name)])."""
    syms = {}
    for extra in ([], ["-D"]):
        out = subprocess.run(["nm", "-C", "-S", "--defined-only", *extra, path], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.match(r"([0-9a-f]+) ([0-9a-f]+) [tTwWiI] (.*)", line)
            if m:
                syms.setdefault(int(m.group(1), 16), (int(m.group(2), 16), m.group(3)))
    items = sorted((a, s, n) for a, (s, n) in syms.items())
    return [a for a, _, _ in items], items


class Resolver:
    def __init__(self, maps, libs):
        self.maps = maps  # [(start, end, file offset, path)]
        self.starts = [m[0] for m in maps]
        self.libs = {}
        for name, path in libs.items():
            self.libs[name] = (segments(path), *symbols(path))
        self.cache = {}

    def lib_for(self, path):
        base = os.path.basename(path)
        for name, data in self.libs.items():
            if base == name or base.startswith(name):
                return data
        return None

    def name(self, pc):
        if pc in self.cache:
            return self.cache[pc]
        i = bisect.bisect_right(self.starts, pc) - 1
        res = "?"
        if i >= 0 and pc < self.maps[i][1]:
            start, _, off, path = self.maps[i]
            lib = self.lib_for(path)
            base = os.path.basename(path) or "[anon]"
            res = f"[{base}]"
            if lib:
                segs, addrs, items = lib
                foff = pc - start + off
                vaddr = None
                for so, sv, sz in segs:
                    if so <= foff < so + sz:
                        vaddr = foff - so + sv
                if vaddr is not None:
                    j = bisect.bisect_right(addrs, vaddr) - 1
                    if j >= 0:
                        a, size, n = items[j]
                        if vaddr < a + max(size, 1) or size == 0:
                            res = n
        self.cache[pc] = res
        return res


def short(name, width=150):
    """The name without its argument list (the last balanced parentheses), cut to `width`."""
    if len(name) > width:
        end = name[:-6] if name.endswith(" const") else name
        if end.endswith(")"):
            depth = 0
            for i in range(len(end) - 1, -1, -1):
                depth += {")": 1, "(": -1}.get(end[i], 0)
                if depth == 0:
                    name = end[:i]
                    break
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--lib", action="append", default=[], help="NAME=PATH")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--under", default=None)
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--tid", type=int, default=None, help="the thread to report (default: the lowest id sampled)")
    args = ap.parse_args()
    samples, maps = [], []
    for line in open(args.trace):
        if line.startswith("S "):
            f = line.split()
            samples.append((int(f[1]), [int(x, 16) for x in f[2:]]))
        elif line.startswith("M "):
            f = line[2:].split()
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            maps.append((lo, hi, int(f[2], 16), f[5] if len(f) > 5 else ""))
    maps.sort()
    r = Resolver(maps, dict(x.split("=", 1) for x in args.lib))
    # Threads created by the sampled one inherit its name (MLX's workers): by default the oldest
    # (lowest id) is the one meant.
    by_tid = collections.Counter(t for t, _ in samples)
    print("samples per thread:", ", ".join(f"{t}: {c}" for t, c in sorted(by_tid.items())))
    tid = args.tid if args.tid is not None else min(by_tid)
    stacks = []
    for t, s in samples:
        if t != tid:
            continue
        # backtrace()'s first two frames are the signal handler and the kernel's return
        # trampoline; the third is the interrupted pc, the rest return addresses (looked up
        # one byte back, inside the call).
        s = s[2:]
        stacks.append([r.name(pc - (1 if k > 0 else 0)) for k, pc in enumerate(s)])
    if args.under:
        stacks = [s for s in stacks if any(args.under in n for n in s)]
    for ex in args.exclude:
        stacks = [s for s in stacks if not any(ex in n for n in s)]
    n = len(stacks)
    print(f"thread {tid}: {n} samples")
    own = collections.Counter(s[0] if s else "?" for s in stacks)
    incl = collections.Counter()
    for s in stacks:
        for name in set(s):
            incl[name] += 1
    print("\n== self (innermost frame)")
    for name, c in own.most_common(args.top):
        print(f"{100 * c / n:6.1f} %  {short(name)}")
    print("\n== inclusive")
    for name, c in incl.most_common(args.top):
        print(f"{100 * c / n:6.1f} %  {short(name)}")


if __name__ == "__main__":
    main()
