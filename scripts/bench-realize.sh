#!/usr/bin/env bash
# Realize benchmarks (issue 3), in one run, as ratios against podman build of the
# equivalent Containerfile FROM an image imported from the same seed. Needs root,
# network to Debian's mirror, podman and runc (apt-get install podman runc),
# hyperfine. Usage: scripts/bench-realize.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v hyperfine >/dev/null || need+=(hyperfine)
command -v bc >/dev/null || need+=(bc)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
work=${1:-$(mktemp -d /var/tmp/shed-bench-XXXX)}
mkdir -p "$work"
make -s build
shed="$PWD/bin/shed"
export SHED_ROOT="$work/root"
rm -rf "$SHED_ROOT" "$work/w"
mkdir -p "$work/w/seed" "$work/w/jq" "$work/w/jqcurl"
$shed init >/dev/null

cat > "$work/w/seed/workshop.toml" <<'T'
name = "bench-seed"
seed = "debian/bookworm"
T
cat > "$work/w/jq/workshop.toml" <<'T'
name = "bench-jq"
seed = "debian/bookworm"
[apt]
packages = ["jq"]
T
cat > "$work/w/jqcurl/workshop.toml" <<'T'
name = "bench-jq-curl"
seed = "debian/bookworm"
[apt]
packages = ["jq", "curl"]
T

now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc; }

echo "== seed"
t0=$(now); $shed realize "$work/w/seed/workshop.toml" >/dev/null 2>&1; t1=$(now)
seed_time=$(secs $t0 $t1)
seed=$($shed --json realize "$work/w/seed/workshop.toml" | sed -n 's/.*"\(\/.*debian-bookworm\)".*/\1/p' | head -1)
echo "seed (mmdebstrap minbase, in the sandbox): ${seed_time}s  $seed"

echo "== cold realize of jq (seed built), lock included"
t0=$(now); $shed realize "$work/w/jq/workshop.toml" >/dev/null 2>&1; t1=$(now)
cold_lock=$(secs $t0 $t1)
layer=$($shed --json realize "$work/w/jq/workshop.toml" | grep -o '"/[^"]*-apt-jq"' | tr -d '"')
# Cold again from the committed lock: drop the layer and the .debs, keep seed + lock.
$shed root rm bench-jq >/dev/null
$shed gc >/dev/null
t0=$(now); $shed realize "$work/w/jq/workshop.toml" >/dev/null 2>&1; t1=$(now)
cold_locked=$(secs $t0 $t1)
layer_size=$(du -sb "$layer" | cut -f1)
$shed realize --check "$work/w/jq/workshop.toml" 2>&1 >/dev/null | tail -1

echo "== podman build (cold, --no-cache) of the same"
podman rmi -f shed-bench-seed shed-bench-jq >/dev/null 2>&1 || true
tar -C "$seed" -c . | podman import - shed-bench-seed:latest >/dev/null
mkdir -p "$work/ctx"
cat > "$work/ctx/Containerfile" <<'T'
FROM localhost/shed-bench-seed:latest
RUN apt-get update && apt-get install -y --no-install-recommends jq
T
pflags=(--runtime runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
t0=$(now); podman build "${pflags[@]}" --no-cache -t shed-bench-jq "$work/ctx" >/dev/null 2>&1; t1=$(now)
podman_cold=$(secs $t0 $t1)
podman_layer=$(podman history --format '{{.Size}}' shed-bench-jq | head -1)

echo "== warm (cache hit): shed realize vs podman build"
hyperfine -N --warmup 3 --runs 30 --export-json "$work/warm.json" \
	"$shed realize $work/w/jq/workshop.toml" \
	"podman build ${pflags[*]} -t shed-bench-jq $work/ctx" 2>&1 | grep -E 'Time|±|faster' || true

echo "== a second recipe sharing most packages (jq + curl after jq)"
out=$($shed --json realize "$work/w/jqcurl/workshop.toml" 2>/dev/null)
fetched=$(echo "$out" | grep -o '"fetched_bytes": [0-9]*' | grep -o '[0-9]*$')
nfetched=$(echo "$out" | sed -n '/"fetched": \[/,/\]/p' | grep -c '.deb"' || true)
total=$(sed -n 's/^size = //p' "$work/w/jqcurl/workshop.lock" | paste -sd+ | bc)

echo
echo "| what | shed | podman | ratio |"
echo "| --- | --- | --- | --- |"
echo "| cold realize of jq, seed built, from the lock | ${cold_locked}s | ${podman_cold}s | $(echo "scale=2; $cold_locked / $podman_cold" | bc) |"
echo "| cold realize of jq, seed built, locking first | ${cold_lock}s | | $(echo "scale=2; $cold_lock / $podman_cold" | bc) |"
echo "| layer size | ${layer_size} B | ${podman_layer} | |"
echo "| second recipe (jq + curl after jq): fetched | ${fetched} B in ${nfetched} files, of ${total} B locked | | |"
echo "| seed | ${seed_time}s | | |"
echo "(warm figures: hyperfine output above; raw data in $work/warm.json)"
