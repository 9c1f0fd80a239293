#!/usr/bin/env bash
# Run every fuzz target briefly, all at once, one worker each (`make test`): 10 s of wall time in all
# instead of 10 s each. Usage: scripts/fuzz-brief.sh GO package:Target...
#
# Go 1.26's fuzz coordinator can fail a target at the -fuzztime boundary with a bare "context deadline
# exceeded" on a loaded machine (golang/go#75804, fixed in Go 1.27): its own shutdown race, not an
# input. A real finding always writes its input ("Failing input written to"), so a target whose only
# failure is that line, with no input written, runs once more; anything else fails at once.
set -uo pipefail
go=$1; shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() { # package target log
	"$go" test -run '^$' -fuzz "^$2\$" -fuzztime 10s -parallel 1 "$1" > "$3" 2>&1
}
flake() { # log: the coordinator's race and nothing else
	grep -q '^    context deadline exceeded$' "$1" && ! grep -q 'Failing input written\|panic:\|_test.go:[0-9]' "$1"
}
for t in "$@"; do
	pkg=${t%%:*}; name=${t##*:}; log="$dir/${pkg//\//_}.$name"
	echo "fuzz $pkg $name (10s)"
	{
		if ! run "$pkg" "$name" "$log"; then
			if flake "$log"; then
				echo "fuzz $pkg $name: the coordinator's deadline race (golang/go#75804), no input: once more"
				run "$pkg" "$name" "$log" || echo "$log" >> "$dir/failed"
			else
				echo "$log" >> "$dir/failed"
			fi
		fi
	} &
done
wait
if [ -e "$dir/failed" ]; then
	while read -r log; do cat "$log"; done < "$dir/failed"
	exit 1
fi
