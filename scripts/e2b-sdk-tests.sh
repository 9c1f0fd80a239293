#!/usr/bin/env bash
# Run E2B's own JS SDK test suite (packages/js-sdk/tests, vitest), unmodified, against
# `shed daemon --e2b`, and print what passed, failed and was skipped, per file and in all.
#
# Usage: scripts/e2b-sdk-tests.sh E2B [BINDIR] [-- VITEST_ARGS...]
#   E2B     an E2B checkout, a bare git repository of one (its HEAD is taken), or its packages/js-sdk
#   BINDIR  where shed, shed-cli, shed-serve and shed-init are (default: this repo's bin/, from `make build`)
#   VITEST_ARGS go to both vitest runs, e.g. `-- tests/sandbox/commands` to run only those files
# Environment:
#   SHED_ROOT             a store to use (made if missing; no supervisor may be running on it). Default:
#                         a new one in /var/tmp, removed at the end
#   E2B_SDK_TESTS_CACHE   where npm installs the SDK's runtime deps and vitest (default ~/.cache/shed-e2b-sdk-tests)
#   E2B_SDK_TESTS_OUT     where report.json (vitest's JSON report, both runs merged) and the logs go (default CACHE/out)
#   E2B_SDK_TESTS_USER    the user the test key acts as (default nobody); the Workshop record `base` allows it
#   E2B_SDK_TESTS_TEMPLATE_USER  the user the template run's key acts as (default root: an operator records
#                         templates; another user's builds are proposals)
#
# Needs: root (a store and Benches), node >= 20 and npm (the npm registry), Debian's mirror the first time a
# store builds the `base` Workshop (python3 python-is-python3 git sudo procps curl, and E2B's account `user`: about 45 s), unshare, ip, openssl and
# libnss-myhostname (for the sandboxes' ports: see Ports below).
# Takes: about 4 minutes on 2 cores: npm install 20 s (the first time), a new store's `base` 45 s, the server run
# 2 minutes, the offline run 40 s. Exit status: 0 when no test failed, 1 when some did, 2 when it could not run.
#
# How: the SDK is copied from E2B (their tests import ../src, so nothing is built; tests/bundle/edgeCompat.test.ts
# skips itself without a dist/, and tsdown needs Node 22), the vitest config is ours (E2B's own loads the browser
# project's playwright) and only selects files and settings of their "unit" project, and everything after the
# store is set up runs in a network namespace of its own, with only loopback: shed's daemon, its Benches and
# vitest. Nothing a test sends leaves the machine: what is not for shed or a mock fails at once.
# Two runs, because the mocks must see the environment E2B's CI gives them:
#   server   the files that reach a server, with E2B_API_URL, E2B_SANDBOX_URL (shed), E2B_API_KEY (a key of
#            E2B_SDK_TESTS_USER's) and E2B_DOMAIN=e2b.localhost (else getHost names e2b.app). The two tests that curl
#            an internet host ("internet access enabled" and "... default") are filtered out (skipped).
# Ports: the tests reach a sandbox's port as https://PORT-ID.e2b.localhost (sandbox.getHost; no port, so 443, and
# TLS, E2B_DEBUG being unset), as users of E2B do. So the daemon serves its E2B address over TLS on 127.0.0.1:443
# (the namespace is ours: 443 is free), with --e2b-domain e2b.localhost (create's `domain`, which getHost uses) and
# a certificate this script makes for *.e2b.localhost and 127.0.0.1, signed by a CA of this run that node trusts
# through NODE_EXTRA_CA_CERTS (two labels under the wildcard: node refuses *.localhost, a wildcard over one
# label). The names resolve to loopback through glibc's myhostname module (libnss-myhostname: every *.localhost
# name is loopback, as RFC 6761 has it), in a mount namespace of this run with an nsswitch.conf that asks it
# first; an /etc/hosts could not list the sandboxes' names, which are random. E2B_API_URL and E2B_SANDBOX_URL are
# https://127.0.0.1 (the one address; the certificate names the IP), so that only the ports' tests need the
# names. Without libnss-myhostname the port tests fail (fetch failed) and the script says why at the start.
# Needs openssl for the certificate.
#   template E2B's template project (tests/template), as the server run: the Template API (docs/agents.md,
#            "Templates"); a build whose steps are not declarations fails there by design.
#   offline  the files that mock the API with msw or test the SDK alone (OFFLINE below), with only a placeholder
#            E2B_API_KEY: their mocks answer for https://api.e2b.app, so shed's URLs would make them miss.
set -euo pipefail

# The unit project's files that reach no server.
OFFLINE=(
	tests/api/handleApiError.test.ts tests/api/http2.test.ts tests/api/inflight.test.ts
	tests/api/validateApiKey.test.ts tests/bundle/edgeCompat.test.ts tests/client.test.ts
	tests/connectionConfig.browser.test.ts
	tests/envd/handleEnvdApiError.test.ts tests/envd/handleRpcError.test.ts tests/envd/http2.test.ts
	tests/is.test.ts tests/logs.test.ts tests/paginator.test.ts tests/runtime.test.ts tests/stripAnsi.test.ts
	tests/undici.test.ts tests/utils.test.ts tests/sandbox/abortSignal.test.ts
	tests/sandbox/commands/commandHandle.test.ts tests/sandbox/configPropagation.test.ts
	tests/sandbox/egressProxy.test.ts tests/sandbox/files/entryInfo.test.ts tests/sandbox/files/watchHandle.test.ts
	tests/sandbox/git/validation.test.ts tests/sandbox/iam.test.ts tests/sandbox/lifecycleRequest.test.ts
	tests/sandbox/networkTransform.test.ts tests/sandbox/rpcHeaders.test.ts tests/sandbox/urls.test.ts
	tests/secret/secret.test.ts tests/volume/file.test.ts tests/volume/volume.test.ts
	tests/template/abortSignal.test.ts tests/template/boundOpts.test.ts tests/template/stacktrace.test.ts
)
SKIP_NAMES='internet access (enabled|default)$'
PORT=443 # the namespace is ours: no other listener there
DOMAIN=e2b.localhost

die() { echo "e2b-sdk-tests: $*" >&2; exit 2; }

if [ "${E2B_SDK_TESTS_STAGE:-}" = netns ]; then
	# Inside the network namespace: the daemon, then both vitest runs. The arguments are vitest's; the outer
	# stage exported the rest. The caller's E2B_* are unset (each run sets its own), and CI: with it,
	# edgeCompat.test.ts fails for want of a dist/.
	for v in $(compgen -e); do case $v in E2B_SDK_TESTS_*) ;; E2B_* | CI) unset "$v" ;; esac; done
	ip link set lo up
	# *.localhost is loopback (see Ports above), in this mount namespace only.
	if [ -n "$MYHOSTNAME" ]; then
		sed -E 's/^hosts:.*/hosts: files myhostname dns/' /etc/nsswitch.conf >"$RUN/nsswitch.conf"
		mount --bind "$RUN/nsswitch.conf" /etc/nsswitch.conf
	fi
	mkdir -p "$SOCKDIR"
	"$SHED" --root "$STORE" daemon --socket "$SOCKDIR/shed.sock" --e2b "127.0.0.1:$PORT" --e2b-domain "$DOMAIN" \
		--e2b-tls-cert "$RUN/tls/cert.pem" --e2b-tls-key "$RUN/tls/key.pem" \
		--user-benches 64 >"$OUT/daemon.log" 2>&1 &
	daemon=$!
	trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$SOCKDIR"' EXIT
	for _ in $(seq 100); do [ -S "$SOCKDIR/shed.sock" ] && break; sleep 0.1; done
	[ -S "$SOCKDIR/shed.sock" ] || { cat "$OUT/daemon.log"; die "the daemon did not start"; }
	cd "$RUN"
	status=0
	echo "== server run: $(wc -l <server.txt) files, E2B_API_URL=https://127.0.0.1, ports at https://PORT-ID.$DOMAIN"
	SHED_E2B_TESTS=server.txt E2B_API_URL="https://127.0.0.1" E2B_SANDBOX_URL="https://127.0.0.1" \
		E2B_DOMAIN="$DOMAIN" E2B_API_KEY="$KEY" NODE_EXTRA_CA_CERTS="$RUN/tls/ca.pem" \
		"$CACHE/node_modules/.bin/vitest" run --config vitest.config.mts --testNamePattern "^(?!.*($SKIP_NAMES))" \
		--reporter=default --reporter=json --outputFile.json="$OUT/report-server.json" --passWithNoTests "$@" || status=1
	echo "== template run: $(wc -l <template.txt) files, E2B's template project, against shed as the server run"
	SHED_E2B_TESTS=template.txt E2B_API_URL="https://127.0.0.1" E2B_SANDBOX_URL="https://127.0.0.1" \
		E2B_DOMAIN="$DOMAIN" E2B_API_KEY="$TEMPLATE_KEY" NODE_EXTRA_CA_CERTS="$RUN/tls/ca.pem" \
		"$CACHE/node_modules/.bin/vitest" run --config vitest.template.mts \
		--reporter=default --reporter=json --outputFile.json="$OUT/report-template.json" --passWithNoTests "$@" || status=1
	echo "== offline run: $(wc -l <offline.txt) files, mocked or SDK-only"
	SHED_E2B_TESTS=offline.txt E2B_API_KEY="e2b_$(printf '0%.0s' $(seq 40))" \
		"$CACHE/node_modules/.bin/vitest" run --config vitest.config.mts \
		--reporter=default --reporter=json --outputFile.json="$OUT/report-offline.json" --passWithNoTests "$@" || status=1
	exit $status
fi

[ "$(id -u)" = 0 ] || die "run me as root: a store and its Benches need it"
[ $# -ge 1 ] || die "usage: scripts/e2b-sdk-tests.sh E2B [BINDIR] [-- VITEST_ARGS...]"
src=$1; shift
bin=$(cd "$(dirname "$0")/.." && pwd)/bin
if [ $# -ge 1 ] && [ "$1" != -- ]; then bin=$1; shift; fi
[ "${1:-}" = -- ] && shift
VITEST_ARGS=("$@")
[ -t 1 ] || export NO_COLOR=1 # a log without vitest's colours
SHED=$(cd "$bin" && pwd)/shed
[ -x "$SHED" ] && [ -x "$bin/shed-cli" ] && [ -x "$bin/shed-serve" ] && [ -x "$bin/shed-init" ] || die "no shed, shed-cli, shed-serve and shed-init in $bin: make build, or name the directory"
for c in node npm unshare ip openssl; do command -v $c >/dev/null || die "$c is missing"; done
MYHOSTNAME=$(ldconfig -p | grep -o '/.*libnss_myhostname\.so\.2' | head -1 || true)
[ -n "$MYHOSTNAME" ] || echo "e2b-sdk-tests: no libnss-myhostname: the tests of sandboxes' ports will fail (apt-get install libnss-myhostname)" >&2
CACHE=${E2B_SDK_TESTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shed-e2b-sdk-tests}
OUT=${E2B_SDK_TESTS_OUT:-$CACHE/out}
USER_=${E2B_SDK_TESTS_USER:-nobody}
TEMPLATE_USER=${E2B_SDK_TESTS_TEMPLATE_USER:-root}
mkdir -p "$CACHE" "$OUT"
CACHE=$(cd "$CACHE" && pwd) OUT=$(cd "$OUT" && pwd)
# A run directory of its own: two runs at once (of two checkouts) must not share one.
RUN=$(mktemp -d "$CACHE/run.XXXXXX")
trap 'rm -rf "$RUN"' EXIT
rm -f "$OUT"/report*.json "$OUT/daemon.log"

# 1. The SDK, copied out of E2B into RUN/js-sdk: node finds CACHE/node_modules from there.
if [ -f "$src/package.json" ] && [ -d "$src/tests" ]; then
	cp -r "$src" "$RUN/js-sdk"
elif [ -d "$src/packages/js-sdk" ]; then
	cp -r "$src/packages/js-sdk" "$RUN/js-sdk"
elif git --git-dir="$src" rev-parse --verify -q HEAD:packages/js-sdk >/dev/null; then
	git --git-dir="$src" archive HEAD packages/js-sdk | tar -x -C "$RUN"
	mv "$RUN/packages/js-sdk" "$RUN/js-sdk" && rmdir "$RUN/packages"
	echo "E2B $(git --git-dir="$src" log -1 --format='%h %s' HEAD)"
else
	die "$src is neither an E2B checkout, a bare repository of one, nor its packages/js-sdk"
fi
rm -rf "$RUN/js-sdk/node_modules" "$RUN/js-sdk/dist" "$RUN/js-sdk/.env"
sdk=$RUN/js-sdk

# 2. From npm: the SDK's dependencies (as its package.json ranges them) and what its tests import.
node -e '
const p = require(process.argv[1]);
const deps = { ...p.dependencies, ...p.optionalDependencies };
for (const n of ["vitest", "msw", "error-stack-parser-es"]) deps[n] = p.devDependencies[n];
console.log(JSON.stringify({ name: "shed-e2b-sdk-tests", private: true, dependencies: deps }, null, 2));
' "$sdk/package.json" >"$CACHE/package.json.new"
if ! cmp -s "$CACHE/package.json.new" "$CACHE/package.json" || [ ! -x "$CACHE/node_modules/.bin/vitest" ]; then
	mv "$CACHE/package.json.new" "$CACHE/package.json"
	(cd "$CACHE" && npm install --no-audit --no-fund --loglevel=error)
fi
rm -f "$CACHE/package.json.new"
echo "SDK $(node -p 'require(process.argv[1]).version' "$sdk/package.json"), vitest $("$CACHE/node_modules/.bin/vitest" --version)"

# Which files each run gets: E2B's unit project, less what it excludes.
(cd "$sdk" && find tests -name '*.test.ts' ! -path 'tests/runtimes/*' ! -path 'tests/template/*' \
	! -name connectionConfig.test.ts | sort) >"$RUN/all.txt"
printf '%s\n' "${OFFLINE[@]}" | sort >"$RUN/offline-listed.txt"
comm -12 "$RUN/all.txt" "$RUN/offline-listed.txt" >"$RUN/offline.txt"
comm -23 "$RUN/all.txt" "$RUN/offline-listed.txt" >"$RUN/server.txt"
# E2B's "template" project: the Template API's tests, against shed as the server run, with its timeout.
(cd "$sdk" && find tests/template -name '*.test.ts' | sort) >"$RUN/template-all.txt"
comm -23 "$RUN/template-all.txt" "$RUN/offline-listed.txt" >"$RUN/template.txt"
comm -12 "$RUN/template-all.txt" "$RUN/offline-listed.txt" >>"$RUN/offline.txt"
cat >"$RUN/vitest.config.mts" <<'EOF'
// E2B's "unit" project (packages/js-sdk/vitest.config.mts), on the files listed in SHED_E2B_TESTS.
import { readFileSync } from 'node:fs'
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    root: new URL('./js-sdk', import.meta.url).pathname,
    name: 'unit',
    include: readFileSync(process.env.SHED_E2B_TESTS!, 'utf8').split('\n').filter(Boolean),
    isolate: true,
    globals: false,
    testTimeout: 30_000,
    environment: 'node',
    bail: 0,
    setupFiles: ['tests/globalFetchFallback.setup.ts'],
    deps: { interopDefault: true },
  },
})
EOF
sed -e "s/name: 'unit'/name: 'template'/" -e 's/testTimeout: 30_000/testTimeout: 180_000/' "$RUN/vitest.config.mts" >"$RUN/vitest.template.mts"

# The E2B address's certificate (see Ports above): a CA of this run, and a server certificate it signs.
mkdir -p "$RUN/tls"
(
	cd "$RUN/tls"
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=shed e2b-sdk-tests CA" \
		-keyout ca-key.pem -out ca.pem
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$DOMAIN" -keyout key.pem -out req.pem
	printf 'subjectAltName=DNS:%s,DNS:*.%s,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$DOMAIN" "$DOMAIN" >ext.cnf
	openssl x509 -req -in req.pem -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 -extfile ext.cnf -out cert.pem
) >/dev/null 2>&1 || die "openssl could not make the E2B address's certificate"

# 3. A store with the Workshop record `base` (E2B's tests create every sandbox of the template "base"), and a key.
if [ -n "${SHED_ROOT:-}" ]; then
	STORE=$SHED_ROOT
else
	tmp=$(mktemp -d /var/tmp/shed-e2b-sdk-tests.XXXXXX)
	STORE=$tmp/root
fi
"$SHED" --root "$STORE" init >/dev/null
if "$SHED" --root "$STORE" workshop show base >/dev/null 2>&1; then
	echo "the store has a record base: using it as it is (it must allow $USER_)"
else
	mkdir -p "$RUN/record"
	cat >"$RUN/record/workshop.toml" <<'EOF'
# What E2B's "base" template has that the tests use (`python` too: host.test.ts serves with python -m http.server).
# No network: allowInternetAccess can only take it away.
# Its commands run as `user` (home /home/user, passwordless sudo), as E2B's do; root stays available.
name = "base"
seed = "debian/bookworm"
user = "user"
[apt]
packages = ["python3", "python-is-python3", "git", "sudo", "procps", "curl"]
[[account]]
name = "user"
sudo = true
EOF
	"$SHED" --root "$STORE" workshop add --allow "$USER_" "$RUN/record/workshop.toml"
fi
"$SHED" --root "$STORE" realize base >/dev/null
made=$("$SHED" --root "$STORE" --json agent key create "$USER_")
KEY=$(node -p 'JSON.parse(process.argv[1]).key' "$made")
key_id=$(node -p 'JSON.parse(process.argv[1]).id' "$made")
# The template run's key: a template build is an operator's act (another key's build is a proposal).
made=$("$SHED" --root "$STORE" --json agent key create "$TEMPLATE_USER")
TEMPLATE_KEY=$(node -p 'JSON.parse(process.argv[1]).key' "$made")
template_key_id=$(node -p 'JSON.parse(process.argv[1]).id' "$made")
cleanup() {
	"$SHED" --root "$STORE" agent key rm "$key_id" >/dev/null || true
	"$SHED" --root "$STORE" agent key rm "$template_key_id" >/dev/null || true
	[ -z "${tmp:-}" ] || rm -rf "$tmp"
	rm -rf "$RUN"
}
trap cleanup EXIT

# 4. The daemon and both runs, in a network namespace with only loopback (the stage above).
echo "store $STORE, key $key_id of $USER_, $(wc -l <"$RUN/server.txt") server files, $(wc -l <"$RUN/offline.txt") offline files"
start=$(date +%s)
status=0
E2B_SDK_TESTS_STAGE=netns SHED="$SHED" STORE="$STORE" KEY="$KEY" TEMPLATE_KEY="$TEMPLATE_KEY" CACHE="$CACHE" OUT="$OUT" RUN="$RUN" \
	SOCKDIR="/run/shed-e2b-sdk-tests.$$" MYHOSTNAME="$MYHOSTNAME" DOMAIN="$DOMAIN" unshare --net --mount -- bash "$0" "${VITEST_ARGS[@]}" || status=$?
[ -f "$OUT/report-server.json" ] && [ -f "$OUT/report-offline.json" ] || die "vitest wrote no report (exit $status)"

# 5. One report (vitest's JSON format, the two runs' results together) and the summary.
node - "$OUT" "$(($(date +%s) - start))" <<'EOF'
const fs = require('node:fs')
const [out, secs] = process.argv.slice(2)
const runs = ['server', 'template', 'offline'].filter((run) => fs.existsSync(`${out}/report-${run}.json`)).map((run) => [run, JSON.parse(fs.readFileSync(`${out}/report-${run}.json`, 'utf8'))])
const merged = { ...runs[0][1], testResults: [] }
for (const k of Object.keys(merged)) if (typeof merged[k] === 'number' && k !== 'startTime') merged[k] = runs.reduce((n, [, r]) => n + r[k], 0)
merged.success = runs.every(([, r]) => r.success)
const total = { passed: 0, failed: 0, skipped: 0 }
const failures = []
for (const [run, r] of runs) {
  const sum = { passed: 0, failed: 0, skipped: 0 }
  console.log(`\n${run}: passed failed skipped  file`)
  for (const f of r.testResults.sort((a, b) => a.name.localeCompare(b.name))) {
    merged.testResults.push({ ...f, run })
    const file = f.name.replace(/.*\/js-sdk\//, '')
    const c = { passed: 0, failed: 0, skipped: 0 }
    for (const a of f.assertionResults) {
      const s = a.status === 'passed' || a.status === 'failed' ? a.status : 'skipped'
      c[s]++
      if (s === 'failed') failures.push(`${file} > ${a.fullName}: ${(a.failureMessages[0] || '').split('\n')[0].slice(0, 240)}`)
    }
    // A file that failed to load has no tests but a message.
    if (f.assertionResults.length === 0 && f.status === 'failed') {
      c.failed++
      failures.push(`${file}: ${(f.message || '').split('\n')[0].slice(0, 240)}`)
    }
    for (const s in c) sum[s] += c[s], total[s] += c[s]
    console.log(`${String(c.passed).padStart(6)} ${String(c.failed).padStart(6)} ${String(c.skipped).padStart(7)}  ${file}`)
  }
  console.log(`${run}: ${sum.passed} passed, ${sum.failed} failed, ${sum.skipped} skipped`)
}
fs.writeFileSync(`${out}/report.json`, JSON.stringify(merged))
if (failures.length) console.log(`\nfailed:\n${failures.join('\n')}`)
console.log(`\nall: ${total.passed} passed, ${total.failed} failed, ${total.skipped} skipped in ${secs} s`)
console.log(`report: ${out}/report.json, daemon log: ${out}/daemon.log`)
EOF
exit $status
