#!/usr/bin/env bash
# Runtime closure vs build inputs (issue 13): for the jq and the Python Workshops, what an export
# ships (the runtime closure, against --with-build-inputs, which is what every copy shipped while a
# layer referenced its .debs), and what the store keeps after gc (keep_build_inputs off, against on,
# the old behaviour). One store, both sides measured in the same run. Needs root and Debian's mirror;
# the Python Workshop's pip index is Debian's own wheels, served on loopback.
# Usage: scripts/bench-closure.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-$(mktemp -d /var/tmp/shed-closure-XXXX)}
make -s build
shed="$PWD/bin/shed --root $work/root"
export SHED_SOCKET=none
dpkg -s python3-pip-whl python3-setuptools-whl >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip-whl python3-setuptools-whl; }
mkdir -p "$work/wheels" && cp /usr/share/python-wheels/*.whl "$work/wheels/"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
scripts/pip-index.sh "$work/wheels" "$port" 2>/dev/null & idx=$!
trap 'kill $idx' EXIT
sed "s#http://127.0.0.1:8765/simple/#http://127.0.0.1:$port/simple/#" examples/python/workshop.toml > "$work/python.toml"
cp examples/jq/workshop.toml "$work/jq.toml"
[ -d "$work/root" ] || $shed init >/dev/null
for w in jq python; do $shed realize "$work/$w.toml" >/dev/null 2>&1; done

mib() { echo "scale=1; $1 / 1048576" | bc; }
du_b() { du -sb "$1" | cut -f1; }
for w in jq python; do
	for mode in runtime full; do
		rm -rf "$work/export-$w-$mode"
		flag=(); [ $mode = full ] && flag=(--with-build-inputs)
		out=$($shed --json export "${flag[@]}" --oci "$work/export-$w-$mode" "$work/$w.toml")
		n=$(echo "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(len(j["pushed"]))')
		b=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])')
		printf '%-7s export %-22s %3d paths, %7s MiB compressed\n' "$w" "${flag[*]:-(runtime closure)}" "$n" "$(mib "$b")"
	done
done
cfg="$work/root/config.toml"
grep -v '^keep_build_inputs' "$cfg" > "$cfg.new" && mv "$cfg.new" "$cfg"
echo 'keep_build_inputs = true' >> "$cfg"
$shed gc >/dev/null
keep=$(du_b "$work/root/store")
grep -v '^keep_build_inputs' "$cfg" > "$cfg.new" && mv "$cfg.new" "$cfg"
$shed gc >/dev/null
free=$(du_b "$work/root/store")
echo "store after gc, keep_build_inputs = true:  $(mib "$keep") MiB"
echo "store after gc, default (false):           $(mib "$free") MiB ($(echo "scale=1; 100 * ($keep - $free) / $keep" | bc)% less)"
