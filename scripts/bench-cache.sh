#!/usr/bin/env bash
# Cache benchmarks (issue 6), in one run: realize the jq Workshop into an empty
# store by building it (seed with mmdebstrap, .debs from the mirror, the layer)
# against by substituting it from Debian's docker-registry on loopback, where
# another store pushed it; and the push itself. Needs root, Debian's mirror.
# Usage: scripts/bench-cache.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v docker-registry >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry; }
work=${1:-$(mktemp -d /var/tmp/shed-cache-XXXX)}
mkdir -p "$work/w"
make -s build
shed="$PWD/bin/shed"
export SHED_SOCKET=none
cat > "$work/w/workshop.toml" <<'T'
name = "bench-cache"
seed = "debian/bookworm"
[apt]
packages = ["jq"]
T
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/registry.yml" <<Y
version: 0.1
log: {level: error, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/registry}}
http: {addr: 127.0.0.1:$port, secret: bench}
Y
docker-registry serve "$work/registry.yml" 2>>"$work/registry.log" & reg=$!
trap 'kill $reg' EXIT
sleep 1
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# KEEP=1 with a WORKDIR of an earlier run keeps its built store and registry (build and push are
# then not measured again).
if [ "${KEEP:-}" = 1 ] && [ -d "$work/a" ]; then
	build=- push=-
else
	rm -rf "$work/a" && $shed --root "$work/a" init >/dev/null
	t=$(date +%s%N); $shed --root "$work/a" realize "$work/w/workshop.toml" >/dev/null 2>&1; build=$(ms $t)
	t=$(date +%s%N); $shed --root "$work/a" copy --to "oci://127.0.0.1:$port/bench" "$work/w/workshop.toml" >/dev/null; push=$(ms $t)
fi
t=$(date +%s%N); $shed --root "$work/a" copy --to "oci://127.0.0.1:$port/bench" "$work/w/workshop.toml" >/dev/null; push2=$(ms $t)
key=$($shed --root "$work/a" key export)
# The baseline: the raw work on the same bytes, from the same registry in the same run. The trees'
# blobs (layer 2 of each path's artifact), found through the registry's HTTP API, are fetched with
# curl and untarred as they arrive (tar -xz, all blobs at once), every file is hashed (b3sum), and
# the file system is synced (sync -f): fetch + untar + hash + sync, nothing checked.
api="http://127.0.0.1:$port/v2/bench"
accept='Accept: application/vnd.oci.image.manifest.v1+json'
blobs=()
for tag in $(curl -sf "$api/tags/list" | jq -r '.tags[]'); do
	blobs+=($(curl -sf -H "$accept" "$api/manifests/$tag" | jq -r '.layers[2].digest'))
done
command -v b3sum >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends b3sum; }
baseline() {
	local i=0 pids=()
	for d in "${blobs[@]}"; do
		mkdir "$work/raw/$i" && { curl -sf "$api/blobs/$d" | tar -xz -C "$work/raw/$i"; } & pids+=($!)
		i=$((i + 1))
	done
	for p in "${pids[@]}"; do wait "$p"; done
	find "$work/raw" -type f -print0 | xargs -0 b3sum >/dev/null
	sync -f "$work/raw"
}
runs=${RUNS:-5}
subs=() raws=() ratios=()
for i in $(seq "$runs"); do
	# Each side starts from an empty place, its removal synced before the clock starts.
	rm -rf "$work/raw" && mkdir "$work/raw" && sync
	t=$(date +%s%N); baseline; raw=$(ms $t); raws+=($raw)
	rm -rf "$work/b" && $shed --root "$work/b" init >/dev/null && $shed --root "$work/b" key trust "$key" && sync
	t=$(date +%s%N); $shed --root "$work/b" realize --offline --substituter "oci://127.0.0.1:$port/bench" "$work/w/workshop.toml" >/dev/null; sub=$(ms $t); subs+=($sub)
	ratios+=($(echo "scale=2; $sub / $raw" | bc))
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
spread() { printf '%s\n' "$@" | sort -n | awk 'NR==1 {lo=$1} {hi=$1} END {print lo "-" hi}'; }
sub=$(median "${subs[@]}")
echo "realize by building, empty store:        ${build} ms"
echo "push to the registry (seed and layer):  ${push} ms; again (nothing to push): ${push2} ms"
echo "baseline (curl | tar -xz, b3sum, sync):  median $(median "${raws[@]}") ms, $(spread "${raws[@]}") ms (${#blobs[@]} blobs, $runs runs: ${raws[*]})"
echo "realize by substituting, empty store:    median $sub ms, $(spread "${subs[@]}") ms ($runs runs: ${subs[*]})"
echo "substituting / baseline:                 median $(median "${ratios[@]}")x, $(spread "${ratios[@]}")x (per run: ${ratios[*]})"
[ "$build" = - ] || echo "building / substituting:                 $(echo "scale=1; $build / $sub" | bc)x"
