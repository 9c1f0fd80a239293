#!/usr/bin/env bash
# Bench launch benchmarks (issue 4), in one run: `shed bench run -- /bin/true`
# (warm, offline) against the C floor (../shared/bench/floor.c, same layers),
# bubblewrap and `podman run --rm --network=none`; then 8 and 32 concurrent
# launches, p50 and p95. Needs root, Debian's mirror the first time.
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
mkdir -p "$work/floorwd"
if ! podman image exists shed-launch-seed; then
	tar -C "$seed" -c . | podman import - shed-launch-seed:latest >/dev/null
fi
pflags="--runtime runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
hyperfine -N --warmup 5 --runs 100 --export-json "$work/launch.json" \
	"$shed bench run --offline -f $work/w/workshop.toml -- /bin/true" \
	"$work/floor $work/floorwd $top:$seed /bin/true" \
	"bwrap --ro-bind $seed / --proc /proc --dev /dev --tmpfs /tmp --unshare-all --die-with-parent /bin/true" 2>&1 | grep -E 'Benchmark|Time|±|faster|than'
hyperfine -N --warmup 2 --runs 15 "podman run --rm --network=none $pflags shed-launch-seed /bin/true" 2>&1 | grep -E 'Benchmark|Time'

conc() { # N concurrent workers, 4 launches each: p50 and p95 of each launch's wall time
	local n=$1 out="$work/conc-$1.txt"; : > "$out"
	for w in $(seq "$n"); do
		( for i in 1 2 3 4; do
			s=$(date +%s%N); $shed bench run --offline -f "$work/w/workshop.toml" -- /bin/true; e=$(date +%s%N)
			echo $(( (e - s) / 1000 )) >> "$out"
		done ) &
	done
	wait
	sort -n "$out" | awk -v n="$n" '{a[NR]=$1} END {printf "%d concurrent: p50 %.1f ms, p95 %.1f ms (%d launches)\n", n, a[int(NR*0.5)]/1000, a[int(NR*0.95)]/1000, NR}'
}
conc 8
conc 32
