# Toolshed. `make help` lists the targets.
GO        ?= go
FUZZTIME  ?= 1m
BENCHTIME ?= 1s
STATICCHECK = honnef.co/go/tools/cmd/staticcheck@v0.8.2
# How shed is built, here, by the e2e tests and by the scripts: static (no cgo: nothing to load
# at start, runs on any Linux), and without urfave/cli's Markdown/man converter, whose package
# initialization every shed process and every sandbox init would pay (docs/benchmarks.md).
# The version is the latest tag (none yet: 0.0.0-dev); the commit is HEAD's, "-dirty" with uncommitted changes.
VERSION   ?= $(shell git describe --tags --dirty 2>/dev/null || echo 0.0.0-dev)
COMMIT    ?= $(shell c=$$(git rev-parse --short=12 HEAD 2>/dev/null) && { git diff --quiet HEAD -- 2>/dev/null && echo $$c || echo $$c-dirty; })
BUILDFLAGS = -tags urfave_cli_no_docs -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)"
LEANFLAGS  = -tags urfave_cli_no_docs,shed_lean -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)"
PREFIX    ?= /usr/local
# Every fuzz target, as package:Target.
FUZZ_TARGETS = ./cache:FuzzReadLayer ./recipe:FuzzParse ./derivation:FuzzDecode ./store:FuzzParseManifest ./store:FuzzDecodeRecord ./api:FuzzDecode

.PHONY: help deps build install uninstall example test test-daemon bench bench-scale lint fuzz docs generate clean

help: ## show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: ## install (as root, with apt-get) the Debian packages that example and test use and that are missing: scripts/deps.sh, as CI does
	scripts/deps.sh

# bin/shed is the small front (cmd/shed-front): it sends `bench run` and `bench exec` to a supervisor itself
# and hands every other command to the CLI beside it, bin/shed-cli (cmd/shed built lean: tag shed_lean),
# which hands the servers (daemon, mcp, snapshotter) and `k8s` to bin/shed-serve (cmd/shed whole), so
# that no other command pays their libraries' package initialization (docs/architecture.md).
build: ## build bin/shed (a small front), bin/shed-cli (the CLI it runs for most commands), bin/shed-serve (the CLI with the servers) and bin/shed-init (the Bench's init)
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o bin/shed-serve ./cmd/shed
	CGO_ENABLED=0 $(GO) build $(LEANFLAGS) -o bin/shed-cli ./cmd/shed
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o bin/ ./cmd/shed-init
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o bin/shed ./cmd/shed-front

example: build ## set up a store (SHED_ROOT, default /var/lib/toolshed) and realize examples/jq from Debian's mirror
	@command -v mmdebstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends mmdebstrap; }
	bin/shed init
	bin/shed realize examples/jq/workshop.toml
	bin/shed realize examples/jq/workshop.toml
	bin/shed why examples/jq/workshop.toml /usr/bin/jq

# The e2e package (tests/) takes about 12 minutes here (700-770 s in CI): its heavy tests run in parallel, four at a time,
# longest first (-parallel 4: they mostly wait on dpkg, the mirror and their sandboxes, so four keep two cores
# busy; see parallelTests in tests/main_test.go and parallel in tests/parallel_test.go). go test's default
# limit of 10 minutes per package is there to catch hangs, so it is set well above that.
test: ## run every test (as root: the store and sandbox tests are real), then each fuzz target briefly
	$(GO) vet ./...
	$(GO) test -race -count=1 -parallel 4 -timeout 30m ./...
	scripts/fuzz-brief.sh $(GO) $(FUZZ_TARGETS)

# The end-to-end tests again, each through a supervisor of its store (`shed daemon`) instead of on the store
# directly: the same tests, so the typed API carries everything the CLI does. CI runs both.
test-daemon: ## run the end-to-end tests (tests/) through the supervisor, as a local operator would
	@# TestMCP, every TestE2B* and TestAgentFacesOneName drive a supervisor of their own in either pass, TestReadmeBlocks
	@# runs the README as written (no supervisor), TestRootless and TestRootlessNoSubIDs run shed as an ordinary
	@# user, who has no supervisor, and TestRootlessBesideDaemon as one beside a supervisor of its own: the second
	@# pass would repeat the first.
	SHED_TEST_VIA=daemon $(GO) test -count=1 -parallel 4 -timeout 40m -skip '^(TestMCP|TestE2B.*|TestBranchCLI|TestAgentFacesOneName|TestReadmeBlocks|TestRootless|TestRootlessNoSubIDs|TestRootlessBesideDaemon)$$' ./tests

bench: build ## run the benchmarks: Go benchmarks, realize vs podman build, Bench launch vs floor/bwrap/podman, bench exec vs nsenter, substitute vs build, verify vs b3sum, the E2B SDK in ComputeSDK's modes (docs/benchmarks.md)
	@# -timeout: ./tests builds a seed, then BenchmarkAgentCreate and BenchmarkE2B (a burst of 100 sandboxes) run.
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -timeout 40m ./...
	scripts/bench-realize.sh
	scripts/bench-launch.sh
	scripts/bench-exec.sh
	scripts/bench-cache.sh
	scripts/bench-closure.sh
	scripts/bench-rootless.sh
	scripts/bench-verify.sh

# At scale: gc of stores of 100,000 and 1,000,000 synthetic paths, made straight on disk (minutes, and about
# 8 GB for the largest, in $$TMPDIR), one run each, and verify --check-contents of 100,000 paths against b3sum;
# `make bench` runs the 10,000-path ones.
bench-scale: build ## run the benchmarks at scale: gc of 100,000 and 1,000,000 paths, verify of 100,000 vs b3sum, a snapshot of an upper of 1,000,000 files (docs/benchmarks.md)
	SHED_BENCH_SCALE=1 $(GO) test -run '^$$' -bench '^BenchmarkGC(Files)?(10000|100000|1000000)$$' -benchmem -benchtime 1x -timeout 2h ./store
	scripts/bench-verify.sh 100000
	SHED_BENCH_SCALE=1 $(GO) test -run '^$$' -bench '^BenchmarkBranchFiles1000000$$' -benchtime 1x -timeout 30m ./upper
	SHED_BENCH_SCALE=1 $(GO) test -run '^$$' -bench '^BenchmarkBranching/snapshot-1M-files$$' -benchtime 1x -timeout 30m ./app

lint: ## gofmt, go vet, staticcheck, and go mod tidy must leave no diff
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags shed_lean ./cmd/shed ./app
	$(GO) run $(STATICCHECK) ./...
	$(GO) mod tidy -diff

fuzz: ## fuzz every target for FUZZTIME (default 1m) each
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

docs: build ## regenerate docs/cli.md and the man page from the CLI definition, and docs/api.md's operations from package app
	bin/shed man --markdown > docs/cli.md
	mkdir -p docs/man && bin/shed man > docs/man/shed.1
	SHED_UPDATE_DOCS=1 $(GO) test -count=1 -run TestAPIDoc ./api

# The directories install puts files in. install records in libexec/shed/dirs (as PREFIX-absolute
# paths, without DESTDIR) those of them, and of their parents, that did not exist before it, so that
# uninstall removes those, when empty, and never one that was there before (PREFIX/bin itself...).
INSTALL_DIRS = bin libexec/shed share/man/man1 share/bash-completion/completions share/zsh/site-functions share/fish/vendor_completions.d

install: build ## install shed, the CLI it runs (libexec/shed/shed-cli and shed-serve), its init (libexec/shed/shed-init), its man page and shell completions under DESTDIR/PREFIX (default /usr/local)
	@new=; for d in $(INSTALL_DIRS); do d='$(PREFIX)'/$$d; \
		while [ -n "$$d" ] && [ "$$d" != / ] && [ "$$d" != . ] && [ ! -d '$(DESTDIR)'"$$d" ]; do new="$$new$$d\n"; d=$$(dirname "$$d"); done; \
	done; mkdir -p $(addprefix $(DESTDIR)$(PREFIX)/,$(INSTALL_DIRS)); \
	{ cat '$(DESTDIR)$(PREFIX)/libexec/shed/dirs' 2>/dev/null; printf %b "$$new"; } | LC_ALL=C sort -u > '$(DESTDIR)$(PREFIX)/libexec/shed/dirs.new' && \
	mv '$(DESTDIR)$(PREFIX)/libexec/shed/dirs.new' '$(DESTDIR)$(PREFIX)/libexec/shed/dirs'
	install -m 0755 bin/shed $(DESTDIR)$(PREFIX)/bin/shed
	install -m 0755 bin/shed-cli $(DESTDIR)$(PREFIX)/libexec/shed/shed-cli
	install -m 0755 bin/shed-serve $(DESTDIR)$(PREFIX)/libexec/shed/shed-serve
	install -m 0755 bin/shed-init $(DESTDIR)$(PREFIX)/libexec/shed/shed-init
	install -m 0644 docs/man/shed.1 $(DESTDIR)$(PREFIX)/share/man/man1/shed.1
	bin/shed completion bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/shed
	bin/shed completion zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_shed
	bin/shed completion fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/shed.fish

uninstall: ## remove what install installed, and the directories it made, when empty
	rm -f $(DESTDIR)$(PREFIX)/bin/shed $(DESTDIR)$(PREFIX)/libexec/shed/shed-cli $(DESTDIR)$(PREFIX)/libexec/shed/shed-serve \
		$(DESTDIR)$(PREFIX)/libexec/shed/shed-init $(DESTDIR)$(PREFIX)/share/man/man1/shed.1 \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions/shed $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_shed \
		$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/shed.fish
	@# Deepest first: a directory sorts after its parent. libexec/shed is shed's own, recorded or not.
	@dirs=$$(cat '$(DESTDIR)$(PREFIX)/libexec/shed/dirs' 2>/dev/null); rm -f '$(DESTDIR)$(PREFIX)/libexec/shed/dirs'; \
	for d in $$( { printf '%s\n' $$dirs; echo '$(PREFIX)/libexec/shed'; } | LC_ALL=C sort -ru); do \
		[ ! -d '$(DESTDIR)'"$$d" ] || rmdir --ignore-fail-on-non-empty '$(DESTDIR)'"$$d"; \
	done

generate: ## regenerate the E2B API's envd messages and Connect handlers from e2b/envd/*.proto (needs protoc: apt-get install protobuf-compiler)
	GOBIN=$(CURDIR)/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go connectrpc.com/connect/cmd/protoc-gen-connect-go
	PATH=$(CURDIR)/bin:$$PATH protoc -I e2b/envd -I /usr/include --go_out=. --go_opt=module=toolshed.dev/shed \
		--connect-go_out=. --connect-go_opt=module=toolshed.dev/shed e2b/envd/process.proto e2b/envd/filesystem.proto

clean: ## remove build output
	rm -rf bin
