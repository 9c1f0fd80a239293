#!/usr/bin/env bash
# Bench launch benchmarks (issues 4 and 15), in one run: `shed bench run -- /bin/true`
# (warm, offline), on the store and through its supervisor (`shed daemon`, warm
# pool), against the C floor (../shared/bench/floor.c, same layers) and
# bubblewrap: wall time and CPU per launch, and the throughput of 8 and 32
# concurrent launches, in interleaved rounds (scripts/launch-bench.py); then
# `podman run --rm --network=none`. Needs root, Debian's mirror the first time.
# ROUNDS (3) and LAUNCHES (60 per round) set the size.
# Usage: scripts/bench-launch.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
for t in hyperfine bwrap podman runc gcc bc; do
	command -v $t >/dev/null || need+=($t)
done
[ ${#need[@]} -eq 0 ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	$(printf '%s\n' "${need[@]}" | sed 's/^bwrap$/bubblewrap/'); }
work=${1:-$(mktemp -d /var/tmp/shed-launch-XXXX)}
mkdir -p "$work/w"
make -s build
shed="$PWD/bin/shed"
export SHED_ROOT="$work/root"
$shed init >/dev/null
cat > "$work/w/workshop.toml" <<'T'
name = "bench-launch"
seed = "debian/bookworm"
[apt]
packages = ["jq"]
T
layers=$($shed realize "$work/w/workshop.toml" 2>/dev/null)
seed=$(echo "$layers" | sed -n 1p); top=$(echo "$layers" | sed -n 2p)
floor_src=../shared/bench/floor.c
[ -f "$floor_src" ] || floor_src=sandbox/testdata/floor.c
gcc -O2 -o "$work/floor" "$floor_src"
# The isolation floor (../shared/bench/floor-userns.c, flags uisf): the bare floor plus what a Bench's
# isolation costs the kernel (user namespace, idmapped lowers and upper, seccomp, pivot_root, devpts, keyring),
# its idmap namespace kept in an nsfs bind as a slot keeps one. The figures are ratios to it; the bare floor is
# the second reference.
iso_src=../shared/bench/floor-userns.c
[ -f "$iso_src" ] || iso_src=sandbox/testdata/floor-userns.c
gcc -O2 -o "$work/floor-userns" "$iso_src"
mkdir -p "$work/floorwd" "$work/isowd"
export FLOOR_USERNS="$work/userns-keep"
mountpoint -q "$FLOOR_USERNS" 2>/dev/null || "$work/floor-userns" --keep "$FLOOR_USERNS"
if ! podman image exists shed-launch-seed; then
	tar -C "$seed" -c . | podman import - shed-launch-seed:latest >/dev/null
fi
pflags="--runtime runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
# The supervisor of the same store, with its warm pool (its default, --warm 2, and 4 more for this run's
# concurrency), for the launches through it.
sock="$work/shed.sock"
$shed daemon --socket "$sock" --warm 6 >"$work/daemon.log" 2>&1 & daemon=$!
trap 'kill $daemon 2>/dev/null' EXIT
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo 'no AVX-512'), kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
direct=(SHED_SOCKET=none "$shed" bench run --offline -f "$work/w/workshop.toml" -- /bin/true)
viad=(SHED_SOCKET="$sock" "$shed" bench run --offline -f "$work/w/workshop.toml" -- /bin/true)
floor=("$work/floor" "$work/floorwd" "$top:$seed" /bin/true)
iso=("$work/floor-userns" uisf "$work/isowd" "$top:$seed" /bin/true)
bwrap=("$(command -v bwrap)" --ro-bind "$seed" / --proc /proc --dev /dev --tmpfs /tmp --unshare-all --die-with-parent /bin/true)
json=$(python3 -c 'import json, sys; a = sys.argv[1:]; i = [k for k, x in enumerate(a) if x == "|"]
print(json.dumps({"commands": {"shed": a[:i[0]], "shed-daemon": a[i[0]+1:i[1]], "iso-floor": a[i[1]+1:i[2]], "floor": a[i[2]+1:i[3]], "bwrap": a[i[3]+1:i[4]]},
	"daemon": {"shed-daemon": int(a[i[4]+1])}, "floor": "iso-floor", "bare": "floor"}))' "${direct[@]}" "|" "${viad[@]}" "|" "${iso[@]}" "|" "${floor[@]}" "|" "${bwrap[@]}" "|" "$daemon")
python3 scripts/launch-bench.py "${ROUNDS:-3}" "${LAUNCHES:-60}" "$json"
hyperfine -N --warmup 2 --runs 15 "podman run --rm --network=none $pflags shed-launch-seed /bin/true" 2>&1 | grep -E 'Benchmark|Time'
