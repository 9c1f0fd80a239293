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
docker-registry serve "$work/registry.yml" & reg=$!
trap 'kill $reg' EXIT
sleep 1
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
rm -rf "$work/a" && $shed --root "$work/a" init >/dev/null
t=$(date +%s%N); $shed --root "$work/a" realize "$work/w/workshop.toml" >/dev/null 2>&1; build=$(ms $t)
t=$(date +%s%N); $shed --root "$work/a" copy --to "oci://127.0.0.1:$port/bench" "$work/w/workshop.toml" >/dev/null; push=$(ms $t)
t=$(date +%s%N); $shed --root "$work/a" copy --to "oci://127.0.0.1:$port/bench" "$work/w/workshop.toml" >/dev/null; push2=$(ms $t)
key=$($shed --root "$work/a" key export)
subs=()
for i in 1 2 3; do
	rm -rf "$work/b" && $shed --root "$work/b" init >/dev/null && $shed --root "$work/b" key trust "$key"
	t=$(date +%s%N); $shed --root "$work/b" realize --offline --substituter "oci://127.0.0.1:$port/bench" "$work/w/workshop.toml" >/dev/null; subs+=($(ms $t))
done
echo "realize by building, empty store:        ${build} ms"
echo "push to the registry (seed and layer):  ${push} ms; again (nothing to push): ${push2} ms"
echo "realize by substituting, empty store:    ${subs[*]} ms (3 runs)"
echo "building / substituting:                 $(echo "scale=1; $build / ${subs[1]}" | bc)x"
