#!/usr/bin/env python3
"""Per-call instruction profile: the per-function difference of two callgrind runs of
different lengths, divided by the difference in calls (start-up and warm-up cancel out).

    callgrind-diff.py SHORT.out LONG.out CALLS [--inclusive] [--top N]

The files are the ones `topspin-bench --callgrind` prints (e.g. echo-tcp-1000-0.out and
echo-tcp-6000-0.out: CALLS = 5000)."""
import subprocess
import sys
import re


def profile(path, inclusive):
    args = ["callgrind_annotate", "--threshold=100", "--auto=no"]
    if inclusive:
        args.append("--inclusive=yes")
    out = subprocess.run(args + [path], capture_output=True, text=True, check=True).stdout
    fns = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*)$", line)
        if m and "PROGRAM TOTALS" not in line:
            ir = int(m.group(1).replace(",", ""))
            name = re.sub(r"\s*\[[^\]]*\]$", "", m.group(2))
            name = re.sub(r"^.*?/(src|library)/", "", name)
            fns[name] = fns.get(name, 0) + ir
    return fns


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        sys.exit(2)
    short, long_, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    inclusive = "--inclusive" in sys.argv
    top = 40
    if "--top" in sys.argv:
        top = int(sys.argv[sys.argv.index("--top") + 1])
    a, b = profile(short, inclusive), profile(long_, inclusive)
    diff = {k: (b.get(k, 0) - a.get(k, 0)) / calls for k in set(a) | set(b)}
    total = sum(v for v in diff.values()) if not inclusive else None
    rows = sorted(diff.items(), key=lambda kv: -kv[1])[:top]
    if total is not None:
        print(f"{total:10.0f}  instructions per call in total (exclusive sum)")
    for k, v in rows:
        if abs(v) >= 1:
            print(f"{v:10.0f}  {k[:150]}")


main()
