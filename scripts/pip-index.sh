#!/usr/bin/env bash
# Serve a directory of wheels as a PEP 503 simple index, for `[pip] index`:
# writes DIR/simple/NAME/index.html (links with #sha256=) and serves DIR with
# python3's http.server on 127.0.0.1:PORT. The recipe then says
#   [pip]
#   index = "http://127.0.0.1:PORT/simple/"
# Usage: scripts/pip-index.sh DIR [PORT]   (default port 8765)
set -euo pipefail
dir=$(cd "${1:?usage: scripts/pip-index.sh DIR [PORT]}" && pwd)
port=${2:-8765}
rm -rf "$dir/simple"
mkdir -p "$dir/simple"
shopt -s nullglob
for whl in "$dir"/*.whl; do
	file=$(basename "$whl")
	# PEP 503 normal form of the distribution name (the file name's first field).
	name=$(echo "${file%%-*}" | tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/-/g')
	mkdir -p "$dir/simple/$name"
	echo "<a href=\"/$file#sha256=$(sha256sum "$whl" | cut -d' ' -f1)\">$file</a><br>" >> "$dir/simple/$name/index.html"
done
for d in "$dir"/simple/*/; do
	n=$(basename "$d")
	echo "<a href=\"/simple/$n/\">$n</a><br>" >> "$dir/simple/index.html"
done
echo "serving $dir as http://127.0.0.1:$port/simple/" >&2
exec python3 -m http.server "$port" --bind 127.0.0.1 --directory "$dir"
