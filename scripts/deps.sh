#!/usr/bin/env bash
# Install, as root, the Debian packages that building shed, `make example` and `make test` use and
# that are missing (`make deps` runs it; so does .ci/run, on a fresh Debian 12 machine). Go itself is
# not one of them: README.md says where Go 1.26 comes from.
set -euo pipefail
# Debian packages the tests use for real: mmdebstrap builds seeds; busybox-static
# makes the tiny root filesystems of the sandbox's own tests; apt-utils
# (apt-ftparchive), dpkg-dev and gpg make the signed local apt repositories of
# the failure tests; gcc compiles the launch floor the benchmarks compare with;
# iproute2 and python3 make the test host a Bench's network profile reaches;
# Debian's python3 with setuptools and wheel builds the test wheels, served
# with Debian's own pip and setuptools wheels as the loopback pip index;
# script(1) (bsdutils) gives `shed bench shell` a terminal; docker-registry
# (CNCF distribution) is the registry the cache tests push to and pull from
# (started by the tests on loopback; the package's own service is not used); node and npm run the
# real agent clients (the official MCP TypeScript SDK), which the tests install from npm into
# /var/cache/toolshed-ci/npm. bash-completion, zsh and fish are the shells whose completion of shed
# tests/completion_test.go drives. btrfs-progs (mkfs.btrfs) makes the btrfs that branchable Benches'
# uppers live in (package upper). containerd, runc, crun and the CNI plugins are a Kubernetes node's
# runtime as tests/containerd_test.go drives it with crictl (its CRI client, built from Go source
# below, as Debian 12 has none), over `shed snapshotter` (docs/kubernetes.md); the package's own
# service is stopped, the tests start a containerd of their own.
need=()
command -v make >/dev/null || need+=(make)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v apt-ftparchive >/dev/null || need+=(apt-utils)
command -v dpkg-deb >/dev/null || need+=(dpkg-dev)
command -v gpg >/dev/null || need+=(gpg)
command -v gcc >/dev/null || need+=(gcc)
command -v ip >/dev/null || need+=(iproute2)
[ -x /usr/bin/python3 ] || need+=(python3)
command -v unshare >/dev/null || need+=(util-linux)
command -v newuidmap >/dev/null || need+=(uidmap) # shed without root (tests/rootless_test.go)
command -v script >/dev/null || need+=(bsdutils)
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
[ -f /usr/share/bash-completion/bash_completion ] || need+=(bash-completion)
command -v zsh >/dev/null || need+=(zsh)
command -v fish >/dev/null || need+=(fish)
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs)
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
command -v crun >/dev/null || need+=(crun)
[ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins)
/usr/bin/python3 -c 'import setuptools' 2>/dev/null || need+=(python3-setuptools)
/usr/bin/python3 -c 'import wheel' 2>/dev/null || need+=(python3-wheel)
ls /usr/share/python-wheels/pip-*.whl >/dev/null 2>&1 || need+=(python3-pip-whl)
ls /usr/share/python-wheels/setuptools-*.whl >/dev/null 2>&1 || need+=(python3-setuptools-whl)
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
# containerd's package starts its service where systemd runs; the tests use their own.
if command -v systemctl >/dev/null && systemctl is-active -q containerd 2>/dev/null; then
	systemctl disable --now containerd >/dev/null 2>&1 || true
fi
# crictl, the CRI client kubelets' operators use (cri-tools), at the version docs/kubernetes.md names.
if ! command -v crictl >/dev/null; then
	GOBIN=/usr/local/bin go install sigs.k8s.io/cri-tools/cmd/crictl@v1.37.0
fi
