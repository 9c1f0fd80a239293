#!/usr/bin/env bash
# Per-action benchmarks (issue 27), in one run against one supervisor (`shed daemon --e2b`):
#  1. `shed bench exec NAME -- true` through the socket against `nsenter` + exec of the same
#     command into the same Bench's namespaces (user, mount, pid, net, ipc, uts; uid, gid and
#     working directory as bench exec's), interleaved, each a fresh process; medians and their ratio.
#  2. The `e2b` SDK (JS, tests/testdata/e2b-bench.mjs, as nobody with an API key) on loopback:
#     commands.run("true") again and again on one sandbox, and Sandbox.create alone, medians.
# Needs root, node and npm, Debian's mirror the first time. N (200) execs a side, ACTIONS (100),
# CREATES (30); SHED, a shed binary (with its shed-cli, shed-serve and shed-init beside it) to measure instead of this tree's.
# Usage: scripts/bench-exec.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-$(mktemp -d /var/tmp/shed-exec-XXXX)}
mkdir -p "$work/w"
if [ -z "${SHED:-}" ]; then
	make -s build
fi
shed=${SHED:-$PWD/bin/shed}
export SHED_ROOT="$work/root"
$shed init >/dev/null
cat > "$work/w/workshop.toml" <<'T'
name = "bench-exec"
seed = "debian/bookworm"
[apt]
packages = ["jq"]
T
$shed realize "$work/w/workshop.toml" >/dev/null 2>&1
npm=/var/cache/toolshed-ci/npm/e2b # where the tests install the SDK (tests/mcp_test.go)
if [ "$(node -p 'require(process.argv[1]).version' "$npm/node_modules/e2b/package.json" 2>/dev/null)" != 2.51.0 ]; then
	mkdir -p "$npm" && (cd "$npm" && npm install --no-audit --no-fund --loglevel=error e2b@2.51.0)
fi
cp tests/testdata/e2b-bench.mjs "$npm/"
chmod -R a+rX "$npm"
sock="$work/shed.sock"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
$shed daemon --socket "$sock" --e2b "127.0.0.1:$port" >"$work/daemon.log" 2>&1 & daemon=$!
trap 'kill $daemon 2>/dev/null' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
export SHED_SOCKET="$sock"
echo "machine: $(nproc) CPUs, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. bench exec against nsenter into the namespaces of the Bench's command.
name=$($shed bench create -f "$work/w/workshop.toml" --net none --lifetime 30m)
pid=$($shed --json bench ls | python3 -c 'import json, sys; n = sys.argv[1]; print(next(b["pid"] for b in json.load(sys.stdin) if b["name"] == n))' "$name")
pid=$(pgrep -o -P "$pid") # the Bench's command: its init is outside the user namespace
python3 - "${N:-200}" "$shed" "$name" "$pid" "$work/daemon.log" <<'P'
import re, statistics, subprocess, sys, time
n, shed, name, pid, log = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
sides = {
    "bench exec (socket)": [shed, "bench", "exec", name, "--", "true"],
    # As bench exec runs it: root of the Bench, in its root directory and in root's home (the target's
    # cwd); nsenter forks for the pid namespace.
    "nsenter + exec": ["nsenter", "-t", pid, "-U", "-m", "-p", "-n", "-i", "-u", "-S", "0", "-G", "0", "-r", "-w", "--", "true"],
}
ms = {k: [] for k in sides}
for i in range(n + 5):
    for k, argv in sides.items():
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
        if i >= 5:
            ms[k].append((time.perf_counter() - t) * 1000)
med = {k: statistics.median(v) for k, v in ms.items()}
print(f"{'exec of true, ms':<28} {'p50':>8} {'p90':>8} {'n':>5}")
for k, v in ms.items():
    print(f"{k:<28} {med[k]:8.2f} {statistics.quantiles(v, n=10)[-1]:8.2f} {len(v):5d}")
print(f"bench exec / nsenter, p50: {med['bench exec (socket)'] / med['nsenter + exec']:.2f}x (goal 1.5x)")
# The supervisor's own part of each exec, as its log says it (whole ms): the rest is the client's.
own = []
for line in open(log, errors="replace"):
    m = re.search(r"op=bench\.exec .*elapsed=([0-9.]+)(ms|µs|s)$", line.strip())
    if m:
        own.append(float(m[1]) * {"ms": 1, "µs": 0.001, "s": 1000}[m[2]])
if own:
    print(f"  of bench exec, the supervisor's own (its log), p50 {statistics.median(own):.1f} ms, n {len(own)}")
P
$shed bench rm "$name" >/dev/null

# 2. The E2B SDK, as nobody with an API key.
$shed workshop add --allow nobody "$work/w/workshop.toml" >/dev/null 2>&1 || true
key=$($shed --json agent key create nobody | python3 -c 'import json, sys; print(json.load(sys.stdin)["key"])')
sdk() {
	(cd / && HOME=/ E2B_API_URL="http://127.0.0.1:$port" E2B_SANDBOX_URL="http://127.0.0.1:$port" E2B_API_KEY="$key" \
		setpriv --reuid=nobody --regid=nogroup --clear-groups node "$npm/e2b-bench.mjs" bench-exec "$@")
}
out="$work/e2b.json"
{ sdk actions "${ACTIONS:-100}"; sdk create "${CREATES:-30}"; } >"$out"
python3 - "$out" <<'P'
import json, statistics, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["errors"]:
        sys.exit("e2b-bench.mjs %s: %s" % (r["mode"], r["errors"][:3]))
    what, goal = {"actions": ('commands.run("true")', 10), "create": ("Sandbox.create", 30)}[r["mode"]]
    ms = r["ms"]
    print(f"e2b SDK {what:<22} p50 {statistics.median(ms):7.2f} ms  p90 {statistics.quantiles(ms, n=10)[-1]:7.2f} ms  n {len(ms)}  (goal p50 < {goal} ms)")
P
