#!/usr/bin/env python3
"""Compare two shed binaries on one Bench launch, alternately, in one run.

Usage: scripts/bench-ab.py OLD NEW RECIPE [PAIRS]

Runs `BIN bench run --offline -f RECIPE -- /bin/true` with OLD and NEW alternately (the order swapped
every pair, so drift hits both alike), PAIRS times (default 300), and prints the medians, the tenth and
ninetieth percentiles, the CPU time (user + system) of each, and the median of the pairwise differences.
The store is SHED_ROOT's; realize RECIPE first. With AB_SOCKETS="OLD_SOCKET NEW_SOCKET" each binary's launches
go through its own supervisor (start `OLD daemon --socket OLD_SOCKET` and the new one's first); without it,
SHED_SOCKET is whatever the environment says. Both binaries are copied afresh into a temporary
directory each first, with the shed-cli, shed-serve and shed-init beside a small shed (cmd/shed-front): the same binary under
two names differed by 0.9-1.6 ms here when one was the linker's output and the other a copy (how the
page cache holds a file changes what its start costs).
"""
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    if len(sys.argv) < 4:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    tmp = tempfile.mkdtemp(prefix="bench-ab-")
    bins = {}
    for k, src in (("old", sys.argv[1]), ("new", sys.argv[2])):
        # Each in a directory of its own, with the whole CLI that a small shed (cmd/shed-front) runs
        # for what it does not send to a supervisor itself, when there is one beside it.
        os.mkdir(os.path.join(tmp, k))
        bins[k] = os.path.join(tmp, k, "shed")
        shutil.copy2(src, bins[k])
        # And the small init (cmd/shed-init) a launch executes, looked for beside the running binary:
        # without it init is the whole CLI, whose package initialization every launch would pay.
        for extra in ("shed-cli", "shed-serve", "shed-init"):
            p = os.path.join(os.path.dirname(src), extra)
            if os.path.exists(p):
                shutil.copy2(p, os.path.join(tmp, k, extra))
    args = ["bench", "run", "--offline", "-f", sys.argv[3], "--", "/bin/true"]
    pairs = int(sys.argv[4]) if len(sys.argv) > 4 else 300
    env = {k: dict(os.environ) for k in bins}
    if os.environ.get("AB_SOCKETS"):
        for k, sock in zip(("old", "new"), os.environ["AB_SOCKETS"].split()):
            env[k]["SHED_SOCKET"] = sock
    wall = {k: [] for k in bins}
    cpu = {k: [] for k in bins}
    for i in range(pairs):
        for k in (("old", "new") if i % 2 == 0 else ("new", "old")):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run([bins[k]] + args, check=True, env=env[k])
            wall[k].append((time.perf_counter() - t) * 1000)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[k].append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1000)
    for k in bins:
        v = sorted(wall[k])
        print(f"{k} ({sys.argv[1 if k == 'old' else 2]}): median {statistics.median(v):.2f} ms, p10 {v[len(v) // 10]:.2f}, "
              f"p90 {v[len(v) * 9 // 10]:.2f}; CPU median {statistics.median(cpu[k]):.2f} ms")
    d = [n - o for n, o in zip(wall["new"], wall["old"])]
    print(f"new - old, pair by pair: median {statistics.median(d):+.2f} ms over {pairs} pairs")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
