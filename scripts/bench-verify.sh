#!/bin/bash
# Times `shed store verify --check-contents` against b3sum over the same files (issue 15), for two
# shapes of store: 4 big paths (1 GiB in 8 files) and N small paths (two files each, 1 and 3 KiB;
# N is the first argument, 10000 by default; `make bench-scale` passes 100000). The stores are written
# by store's TestWriteBenchStore (registered and signed, without fsyncs), the page cache is warmed,
# then each command runs RUNS times (default 5), interleaved, so that the load of a shared machine
# falls on all of them alike. Reported: the median wall time, CPU time (user + sys) and, for verify,
# peak RSS per path; and the ratio of verify to each b3sum.
#
# The b3sums: "b3sum -t2" is `find | xargs -0 b3sum --num-threads 2` (b3sum hashes one file at a time,
# each with up to 2 threads: a big file on both cores, small ones on one); "b3sum -t1" is the same
# single-threaded; "b3sum -P2" runs two single-threaded b3sums side by side (`xargs -P 2`), which keeps
# both cores busy on small files too. verify does more than they do (lstat, xattrs, readdir, the
# manifest and its record, the provenance signature of every path): its ratio counts all of it.
#
# BEFORE=path/to/shed adds that binary's verify (say, main's) to the same interleaved runs.
#
# Needs: root or not; installs b3sum (Debian) if missing; builds bin/shed with `make -s build`.
set -euo pipefail
cd "$(dirname "$0")/.."

SMALL=${1:-10000}
RUNS=${RUNS:-5}
export GOFLAGS=${GOFLAGS:--buildvcs=false}

if ! command -v b3sum >/dev/null; then
	apt-get update -qq && apt-get install -y -qq b3sum >/dev/null
fi
make -s build
shed=$PWD/bin/shed
work=$(mktemp -d "${TMPDIR:-/var/tmp}/bench-verify.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "b3sum: $(b3sum --version); $(nproc) cores; runs: $RUNS, interleaved"
for shape in big "$SMALL"; do
	root=$work/$shape
	start=$(date +%s)
	SHED_BENCH_STORE=$root SHED_BENCH_SHAPE=$shape go test -count=1 -run '^TestWriteBenchStore$' ./store >/dev/null
	sync # the writeback of a store just written stalls lookups in it (the kernel waits on inode buffers)
	paths=$(find "$root/store" -mindepth 1 -maxdepth 1 | wc -l)
	files=$(find "$root/store" -type f | wc -l)
	bytes=$(find "$root/store" -type f -printf "%s\n" | awk "{s += \$1} END {print s}")
	echo
	echo "== shape $shape: $paths paths, $files files, $((bytes >> 20)) MiB (written in $(($(date +%s) - start)) s)"
	names=(verify "b3sum -t2" "b3sum -t1" "b3sum -P2")
	cmds=(
		"$shed --root $root store verify --check-contents"
		"find $root/store -type f -print0 | xargs -0 b3sum --num-threads 2"
		"find $root/store -type f -print0 | xargs -0 b3sum --num-threads 1"
		"find $root/store -type f -print0 | xargs -0 -P 2 -n $(((files + 1) / 2)) b3sum --num-threads 1"
	)
	if [ -n "${BEFORE:-}" ]; then
		names+=("before")
		cmds+=("$BEFORE --root $root store verify --check-contents")
	fi
	# Warm the page cache and check that the store verifies.
	out=$($shed --root "$root" store verify --check-contents | tail -n 1)
	case $out in *": 0 problems") ;; *) echo "verify: $out" >&2; exit 1 ;; esac
	for c in "${cmds[@]:1}"; do sh -c "$c" >/dev/null; done
	for r in $(seq "$RUNS"); do
		for i in "${!cmds[@]}"; do
			/usr/bin/time -a -o "$work/$shape.$i" -f '%e %U %S %M' sh -c "${cmds[$i]} >/dev/null"
		done
	done
	median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
	printf '%-10s %10s %10s %12s %12s\n' what "wall s" "cpu s" "verify/this" "cpu ratio"
	vw=$(awk '{print $1}' "$work/$shape.0" | median)
	vc=$(awk '{print $2 + $3}' "$work/$shape.0" | median)
	for i in "${!cmds[@]}"; do
		w=$(awk '{print $1}' "$work/$shape.$i" | median)
		c=$(awk '{print $2 + $3}' "$work/$shape.$i" | median)
		printf '%-10s %10.2f %10.2f %12.2f %12.2f\n' "${names[$i]}" "$w" "$c" \
			"$(echo "$vw / $w" | bc -l)" "$(echo "$vc / $c" | bc -l)"
	done
	rss=$(awk '{print $4}' "$work/$shape.0" | median)
	echo "verify peak RSS: $((rss >> 10)) MiB, $((rss * 1024 / paths)) bytes per path"
	rm -rf "$root"
done
