#!/usr/bin/env python3
"""Launch figures for scripts/bench-launch.sh: wall time and CPU per launch, and the throughput of 8 and 32
concurrent launches, for each command against the floor, in interleaved rounds of the same run.

Each launch is spawned with posix_spawn and reaped with wait4, whose rusage is the launch's own CPU (its
process and every descendant it waited for: shed, its init, the command). A launch through the supervisor
also costs the supervisor's CPU: the supervisor's pid is given, and its CPU over the round (its children, the
warm pool's inits, included once reaped) is added, divided by the launches.

The ratios are to "floor" (the isolation floor, ../shared/bench/floor-userns.c uisf), and to "bare" (the bare
floor, floor.c) as a second reference when it is given.

Usage: launch-bench.py ROUNDS N JSON  (JSON: {"commands": {name: argv}, "daemon": {name: pid}, "floor": name, "bare": name})
"""
import json
import os
import statistics
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid):
    """utime + stime + cutime + cstime of pid, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


def launch(argv):
    """One launch: (wall seconds, CPU seconds); fails on a non-zero exit. Leading NAME=VALUE words of
    argv are its environment's, set here rather than by env(1), whose exec would be counted."""
    env = dict(os.environ)
    while "=" in argv[0] and not argv[0].startswith("/"):
        k, v = argv[0].split("=", 1)
        env[k] = v
        argv = argv[1:]
    t = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env)
    _, status, ru = os.wait4(pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"launch-bench: {' '.join(argv)} exited {os.waitstatus_to_exitcode(status)}")
    return wall, ru.ru_utime + ru.ru_stime


def sequential(argv, n, daemon):
    walls, cpu = [], 0.0
    d0 = cpu_of(daemon) if daemon else 0
    for _ in range(n):
        w, c = launch(argv)
        walls.append(w)
        cpu += c
    if daemon:
        cpu += cpu_of(daemon) - d0
    return statistics.median(walls), cpu / n


def concurrent(argv, workers, each, daemon):
    """workers threads of each launches: launches per second, and CPU per launch."""
    cpu = [0.0] * workers

    def worker(i):
        for _ in range(each):
            cpu[i] += launch(argv)[1]

    d0 = cpu_of(daemon) if daemon else 0
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    total = sum(cpu) + (cpu_of(daemon) - d0 if daemon else 0)
    return workers * each / wall, total / (workers * each)


def spread(xs, fmt):
    return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}-{fmt(max(xs))})"


def main():
    rounds, n, conf = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    cmds, daemons, floor, bare = conf["commands"], conf.get("daemon", {}), conf["floor"], conf.get("bare")
    names = list(cmds)
    for name in names:  # warm caches, the pool, the page cache
        for _ in range(5):
            launch(cmds[name])
    wall = {k: [] for k in names}
    cpu = {k: [] for k in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # interleaved, rotated
        for name in order:
            w, c = sequential(cmds[name], n, daemons.get(name))
            wall[name].append(w)
            cpu[name].append(c)
    ms = lambda x: f"{x * 1000:.2f} ms"
    ratio = lambda x: f"{x:.2f}x"
    print(f"one launch at a time: {rounds} rounds of {n} launches each, interleaved; median of the rounds' medians (range)")
    print(f"  {'command':<11} {'wall':<26} {'/ ' + floor:<20} {'/ ' + (bare or '-'):<20} {'CPU per launch':<26} {'/ ' + floor:<20}")
    for name in names:
        wr = [wall[name][i] / wall[floor][i] for i in range(rounds)]
        br = [wall[name][i] / wall[bare][i] for i in range(rounds)] if bare else None
        cr = [cpu[name][i] / cpu[floor][i] for i in range(rounds)]
        print(f"  {name:<11} {spread(wall[name], ms):<26} {spread(wr, ratio):<20} {spread(br, ratio) if br else '-':<20} "
              f"{spread(cpu[name], ms):<26} {spread(cr, ratio):<20}")
    for workers in (8, 32):
        each = max(2, 128 // workers)
        tput = {k: [] for k in names}
        ccpu = {k: [] for k in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                t, c = concurrent(cmds[name], workers, each, daemons.get(name))
                tput[name].append(t)
                ccpu[name].append(c)
        print(f"{workers} concurrent launches, {each} each, {rounds} rounds: launches per second (range), and of {floor}'s")
        for name in names:
            tr = [tput[name][i] / tput[floor][i] for i in range(rounds)]
            print(f"  {name:<11} {spread(tput[name], lambda x: f'{x:.0f}/s'):<26} {spread(tr, ratio):<20} CPU {spread(ccpu[name], ms)}")


if __name__ == "__main__":
    main()
