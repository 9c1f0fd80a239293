#!/usr/bin/env bash
# shed without root (issue 14), in one run: what the user namespace adds to a command and to a Bench
# launch. Root's shed on root's store against an ordinary user's shed on the user's store (the same
# jq Workshop, warm, offline), started with setpriv, whose own cost is measured beside them. Creates
# the user shedbench (with subordinate ids) if missing. Needs root, Debian's mirror the first time.
# Usage: scripts/bench-rootless.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v hyperfine >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine; }
command -v newuidmap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq uidmap; }
id shedbench >/dev/null 2>&1 || useradd --create-home shedbench
grep -q '^shedbench:' /etc/subuid || { echo "shedbench has no subordinate ids: remove the user and run again" >&2; exit 1; }
work=${1:-$(mktemp -d /var/tmp/shed-rootless-XXXX)}
mkdir -p "$work"
chmod 755 "$work"
make -s build
install -m 0755 bin/shed bin/shed-cli bin/shed-serve bin/shed-init "$work/"
shed="$work/shed"
as_user="setpriv --reuid=shedbench --regid=shedbench --init-groups env -i HOME=/home/shedbench PATH=/usr/bin:/bin SHED_SOCKET=none"
mkdir -p "$work/w"
cat > "$work/w/workshop.toml" <<'T'
name = "bench-rootless"
seed = "debian/bookworm"
[apt]
packages = ["jq"]
T
chmod -R a+rX "$work/w"
export SHED_ROOT="$work/root"
$shed init >/dev/null
$shed realize "$work/w/workshop.toml" >/dev/null 2>&1
# The user locks in a copy of their own (the lock file is written beside the recipe).
$as_user sh -c "mkdir -p ~/w && cp $work/w/workshop.toml $work/w/workshop.lock ~/w/ && $shed init >/dev/null && $shed realize ~/w/workshop.toml >/dev/null 2>&1"
hyperfine -N --warmup 5 --runs 60 \
	"$shed bench run --offline -f $work/w/workshop.toml -- /bin/true" \
	"$as_user $shed bench run --offline -f /home/shedbench/w/workshop.toml -- /bin/true" \
	"$shed store ls" \
	"$as_user $shed store ls" \
	"$as_user /bin/true" 2>&1 | grep -E 'Benchmark|Time|±'
