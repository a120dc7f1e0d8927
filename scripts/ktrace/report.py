"""Summarise a ktrace timeline (scripts/ktrace/ktrace.c) over the last W ms of the run (default
150, i.e. the end of decode): GPU busy time (union of kernel intervals), time kernels overlap,
idle gaps, the kernels that take the time, and the driver calls the host made (CUPTI callback ids,
see cupti_driver_cbid.h).

  python3 scripts/ktrace/report.py TRACE [W]
"""
import collections
import sys


def load(path):
    kernels, driver = [], []
    for line in open(path):
        f = line.split(" ", 4)
        if f[0] == "K":  # K start end stream name
            kernels.append((int(f[1]), int(f[2]), int(f[3]), f[4].strip()))
        elif f[0] == "D":  # D start end cbid thread
            driver.append((int(f[1]), int(f[2]), int(f[3])))
    kernels.sort()
    return kernels, driver


def main():
    path = sys.argv[1]
    window_ns = (float(sys.argv[2]) if len(sys.argv) > 2 else 150.0) * 1e6
    kernels, driver = load(path)
    t0 = kernels[-1][1] - window_ns
    ks = [k for k in kernels if k[0] >= t0]
    span = ks[-1][1] - ks[0][0]
    busy, overlap, gaps = 0, 0, []
    cur_s, cur_e = ks[0][0], ks[0][1]
    for s, e, _, _ in ks[1:]:
        if s <= cur_e:
            overlap += min(e, cur_e) - s
            cur_e = max(cur_e, e)
        else:
            busy += cur_e - cur_s
            gaps.append(s - cur_e)
            cur_s, cur_e = s, e
    busy += cur_e - cur_s
    total = sum(e - s for s, e, _, _ in ks)
    print(f"window {span / 1e6:.1f} ms, {len(ks)} kernels, sum of kernel times {total / 1e6:.2f} ms, "
          f"GPU busy {busy / 1e6:.2f} ms ({100 * busy / span:.0f}%), overlapping {overlap / 1e6:.2f} ms")
    if gaps:
        gaps.sort()
        big = [g for g in gaps if g > 20000]
        print(f"idle gaps: {len(gaps)}, total {sum(gaps) / 1e6:.2f} ms, median {gaps[len(gaps) // 2] / 1e3:.1f} us, "
              f"max {gaps[-1] / 1e3:.1f} us; over 20 us: {len(big)} totalling {sum(big) / 1e6:.2f} ms")
    by_name = collections.defaultdict(lambda: [0, 0])
    for s, e, _, name in ks:
        by_name[name[:90]][0] += 1
        by_name[name[:90]][1] += e - s
    print("kernels by time (count, ms):")
    for name, (count, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"  {count:6d} {t / 1e6:8.2f}  {name}")
    calls = collections.Counter(c for s, _, c in driver if s >= t0)
    host = collections.Counter()
    for s, e, c in driver:
        if s >= t0:
            host[c] += e - s
    names = cbid_names()
    print("driver calls by host time (name or cbid: count, ms):")
    for c, t in host.most_common(10):
        print(f"  {names.get(c, c)}: {calls[c]}, {t / 1e6:.2f}")


def cbid_names():
    """cbid -> driver function name, from CUPTI's cupti_driver_cbid.h when $CUPTI_CBID_H names it."""
    import os
    import re
    path = os.environ.get("CUPTI_CBID_H")
    if not path or not os.path.exists(path):
        return {}
    found = re.findall(r"CUPTI_DRIVER_TRACE_CBID_(\w+)\s*=\s*(\d+)", open(path).read())
    return {int(v): k for k, v in found}


if __name__ == "__main__":
    main()
