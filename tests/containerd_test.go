package tests

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	ispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote/auth"

	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/store"
)

// node is one Kubernetes node's runtime on this machine, as a kubelet drives it: a containerd of
// its own (its own root, state and sockets under the test's directory) whose CRI plugin takes every
// image's filesystem from `shed snapshotter` over the node's own shed store, runc and crun as
// runtime handlers, the CNI bridge plugin (a bridge of the test's own, no gateway: pods reach only
// each other), and crictl as the client.
type node struct {
	t            testing.TB
	root         string // the node's shed store
	dir          string
	sock         string // containerd's
	snapSock     string
	snapDir      string
	snapshotter  *exec.Cmd
	snapLog      *bytes.Buffer
	containerd   *exec.Cmd
	containerdLo *bytes.Buffer
	bridge       string
}

// containerdConfig is a node's containerd config (version 2, containerd 1.6): shed's snapshotter as
// a proxy plugin, named as the CRI plugin's snapshotter; the layers' annotations reach it (they do
// regardless; disable_snapshot_annotations = false adds CRI's own, as nodes with remote
// snapshotters set it); the registry on loopback over plain HTTP; the sandbox
// image the tests push there; no oom_score_adj below containerd's own (which this machine, as
// nested machines do, refuses even root).
const containerdConfig = `version = 2
root = "{{dir}}/root"
state = "{{dir}}/state"
[grpc]
  address = "{{dir}}/containerd.sock"
[ttrpc]
  address = "{{dir}}/containerd.sock.ttrpc"
[proxy_plugins]
  [proxy_plugins.shed]
    type = "snapshot"
    address = "{{snap}}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{registry}}/pause:1"
  # This machine refuses a process a lower oom_score_adj than its own, even root's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{{snapshotter}}"
    disable_snapshot_annotations = false
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun.options]
        BinaryName = "/usr/bin/crun"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{{dir}}/cni"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{{registry}}"]
    endpoint = ["http://{{registry}}"]
`

var bridges struct {
	sync.Mutex
	n int
}

// startNode starts the snapshotter on the store at root and a containerd over it, pulling from reg.
func startNode(t testing.TB, root string, reg *registry) *node {
	t.Helper()
	return startNodeWith(t, root, reg, "shed")
}

// startNodeWith is startNode with the CRI plugin's snapshotter named: "shed", or containerd's own
// "overlayfs" (plain layers, downloaded and unpacked: what a node without shed does).
func startNodeWith(t testing.TB, root string, reg *registry, snapshotter string) *node {
	t.Helper()
	for _, bin := range []string{"containerd", "crictl", "runc", "/usr/lib/cni/bridge"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is needed (scripts/deps.sh installs it): %v", bin, err)
		}
	}
	// containerd's shims put their sockets under /run/containerd/s by a hash of the state
	// directory and id: a short directory keeps every path under a unix socket's 108 bytes.
	dir, err := os.MkdirTemp("/run", "shed-node-")
	if err != nil {
		t.Fatal(err)
	}
	bridges.Lock()
	bridges.n++
	n := &node{t: t, root: root, dir: dir, sock: filepath.Join(dir, "containerd.sock"),
		snapSock: filepath.Join(dir, "snapshotter.sock"), snapDir: filepath.Join(dir, "snapshotter"),
		bridge: fmt.Sprintf("shedt%d-%d", os.Getpid()%10000, bridges.n)}
	bridges.Unlock()
	t.Cleanup(n.stop)
	n.startSnapshotter()
	host := fmt.Sprintf("127.0.0.1:%d", reg.port)
	cfg := strings.NewReplacer("{{dir}}", dir, "{{snap}}", n.snapSock, "{{registry}}", host, "{{snapshotter}}", snapshotter).Replace(containerdConfig)
	writeFile(t, filepath.Join(dir, "config.toml"), cfg)
	writeFile(t, filepath.Join(dir, "cni", "10-shed-test.conflist"), fmt.Sprintf(`{
  "cniVersion": "1.0.0", "name": "shed-test",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": false, "ipMasq": false,
     "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "10.250.%d.0/24"}]]}},
    {"type": "loopback"}
  ]
}`, n.bridge, filepath.Join(dir, "ipam"), bridges.n%250))
	n.containerdLo = &bytes.Buffer{}
	// In a mount namespace of its own without the cgroup2 hierarchy this host mounts beside v1 (its
	// "hybrid" cgroups, which crun refuses): its pods' mounts, and the hierarchy's absence, stay in
	// it, and go with it.
	n.containerd = exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi; exec containerd --config "$1"`, "sh", filepath.Join(dir, "config.toml"))
	n.containerd.SysProcAttr = dieWithTests()
	n.containerd.Stdout, n.containerd.Stderr = &lockedWriter{w: n.containerdLo}, &lockedWriter{w: n.containerdLo}
	if err := n.containerd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r := n.crictl("info"); r.code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not come up:\n%s", n.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return n
}

func (n *node) startSnapshotter() {
	n.t.Helper()
	n.snapLog = &bytes.Buffer{}
	cmd := exec.Command(shedBin, "--root", n.root, "snapshotter", "--socket", n.snapSock, "--dir", n.snapDir)
	cmd.Env = append(os.Environ(), "SHED_SOCKET=none")
	cmd.SysProcAttr = dieWithTests()
	cmd.Stdout, cmd.Stderr = &lockedWriter{w: n.snapLog}, &lockedWriter{w: n.snapLog}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.snapshotter = cmd
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("unix", n.snapSock); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the snapshotter did not come up:\n%s", n.snapLog)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (n *node) stopSnapshotter() {
	interrupt(n.snapshotter, 10*time.Second)
	n.snapshotter = nil
}

// interrupt stops cmd as a service manager would: SIGINT, then SIGKILL after grace.
func interrupt(cmd *exec.Cmd, grace time.Duration) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		cmd.Process.Kill()
		<-done
	}
}

func (n *node) logs() string {
	return fmt.Sprintf("containerd:\n%s\nsnapshotter:\n%s", n.containerdLo, n.snapLog)
}

// stop removes the node's pods (their containers and mounts), stops containerd and the
// snapshotter, and removes the bridge and the directory.
func (n *node) stop() {
	if n.containerd != nil {
		if r := n.crictl("pods", "-q"); r.code == 0 {
			for _, id := range strings.Fields(r.stdout) {
				n.crictl("stopp", id)
				n.crictl("rmp", "-f", id)
			}
		}
		interrupt(n.containerd, 15*time.Second)
		n.containerd = nil
	}
	n.stopSnapshotter()
	exec.Command("ip", "link", "del", n.bridge).Run()
	// Mounts containerd left (a shim's rootfs, the sandbox's shm) go before the directory.
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		var mps []string
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], n.dir+"/") {
				mps = append(mps, f[4])
			}
		}
		for i := len(mps) - 1; i >= 0; i-- {
			exec.Command("umount", "-l", mps[i]).Run()
		}
	}
	os.RemoveAll(n.dir)
}

// crictl runs crictl against the node's containerd, for both its runtime and image services.
func (n *node) crictl(args ...string) result {
	ep := "unix://" + n.sock
	cmd := exec.Command("crictl", append([]string{"--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "120s"}, args...)...)
	cmd.Env = append(os.Environ(), "CRI_CONFIG_FILE=/dev/null")
	return runResult(n.t, cmd)
}

func (n *node) mustCrictl(args ...string) string {
	n.t.Helper()
	r := n.crictl(args...)
	if r.code != 0 {
		n.t.Fatalf("crictl %s: exit %d\n%s\n%s", strings.Join(args, " "), r.code, r.stderr, n.logs())
	}
	return strings.TrimSpace(r.stdout)
}

// pod starts a pod sandbox named name on handler (runc, crun) and returns its id and config file.
func (n *node) pod(name, handler string) (string, string) {
	n.t.Helper()
	cfg := writeFile(n.t, filepath.Join(n.dir, "pods", name+".json"), fmt.Sprintf(`{
  "metadata": {"name": %q, "namespace": "default", "uid": "%s-uid", "attempt": 1},
  "log_directory": %q,
  "linux": {}
}`, name, name, filepath.Join(n.dir, "logs", name)))
	return n.mustCrictl("runp", "--runtime", handler, cfg), cfg
}

// container creates and starts a container of image in pod, running sleep.
func (n *node) container(pod, podCfg, name, image string) string {
	n.t.Helper()
	cfg := writeFile(n.t, filepath.Join(n.dir, "containers", name+".json"), fmt.Sprintf(`{
  "metadata": {"name": %q},
  "image": {"image": %q},
  "command": ["sleep", "infinity"],
  "log_path": "%s.log",
  "linux": {}
}`, name, image, name))
	id := n.mustCrictl("create", pod, cfg, podCfg)
	n.mustCrictl("start", id)
	return id
}

// lockedWriter lets a process's stdout and stderr share one buffer.
type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// accessLog is docker-registry's access log: what each request fetched.
type accessLog struct {
	mu    sync.Mutex
	lines []string
}

func (a *accessLog) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		a.lines = append(a.lines, sc.Text())
	}
	return len(p), nil
}

// blobGET matches an access log line of a blob fetched: its digest and the bytes sent.
var blobGET = regexp.MustCompile(`"GET /v2/[^ ]+/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" (\d+) (\d+)`)

// blobs are the blobs fetched from line from on, with the bytes sent for each.
func (a *accessLog) blobs(from int) (map[string]int64, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]int64{}
	for _, l := range a.lines[from:] {
		if m := blobGET.FindStringSubmatch(l); m != nil && m[2] == "200" {
			var n int64
			fmt.Sscan(m[3], &n)
			out[m[1]] += n
		}
	}
	return out, len(a.lines)
}

// startLoggedRegistry is startRegistry with its access log kept.
func startLoggedRegistry(t testing.TB) (*registry, *accessLog) {
	t.Helper()
	log := &accessLog{}
	return startRegistryWith(t, "", log), log
}

// imageLayers reads an image's manifest from the registry: its layers' digests and the store paths
// they are annotated with.
func imageLayers(t testing.TB, reg *registry, repo, tag string) (digests, paths []string) {
	t.Helper()
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/v2/%s/manifests/%s", reg.port, repo, tag), nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m struct {
		Layers []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"layers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	for _, l := range m.Layers {
		digests = append(digests, l.Digest)
		paths = append(paths, l.Annotations["dev.toolshed.path"])
	}
	return digests, paths
}

// pauseImage pushes the pods' sandbox image, a plain image (no store path in it: containerd
// unpacks it into the snapshotter's own directory) of one static program, to reg as pause:1.
func pauseImage(t testing.TB, reg *registry) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pause")
	build := exec.Command("go", "build", "-o", bin, "./testdata/pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, out)
	}
	body, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write(body)
	tw.Close()
	pushImageConfig(t, fmt.Sprintf("127.0.0.1:%d/pause:1", reg.port), ispec.ImageConfig{Entrypoint: []string{"/pause"}}, gzipLayer(t, b.Bytes()))
}

// TestContainerd is a Kubernetes node's flow over shed's store, with crictl driving containerd's
// CRI as a kubelet does: a builder pushes two Workshops that share a Debian seed as images (`shed
// copy --image`); a node whose store starts empty, trusts the builder's key and substitutes from the
// registry pulls the first (its paths come from the cache, signatures checked; no image layer is
// downloaded), then the second, which moves 0 bytes of the seed; a pod on runc runs a command of
// each; `crictl rmi` and `shed gc` while a container runs keep what it uses; the snapshotter
// restarts under running containers; an image that lies about its path, one that names a path no
// cache has, one signed by a key the node does not trust, and a key containerd never prepared are
// refused with errors containerd reports, and nothing of them is left.
func TestContainerd(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	builder := sharedRoot(t)
	reg, access := startLoggedRegistry(t)
	host := fmt.Sprintf("127.0.0.1:%d", reg.port)
	cacheURL := reg.url("shed")
	pauseImage(t, reg)

	dir := t.TempDir()
	one := writeFile(t, filepath.Join(dir, "one", "workshop.toml"), `name = "node-one"
seed = "debian/bookworm"
workdir = "/work"
[apt]
packages = ["jq"]
[env]
GREETING = "hello from a Workshop"
`)
	two := writeFile(t, filepath.Join(dir, "two", "workshop.toml"), `name = "node-two"
seed = "debian/bookworm"
[apt]
packages = ["tree"]
`)
	var copied struct {
		Image struct {
			Ref, Digest string
			Layers      int
		} `json:"image"`
	}
	for tag, file := range map[string]string{"one": one, "two": two} {
		realize(t, builder, file)
		r := mustShed(t, builder, "--json", "copy", "--to", cacheURL, "--image", tag, file)
		if err := json.Unmarshal([]byte(r.stdout), &copied); err != nil || copied.Image.Ref != host+"/shed:"+tag || copied.Image.Layers != 2 {
			t.Fatalf("copy --image %s: %v\n%s", tag, err, r.stdout)
		}
	}
	// The agent-sandbox objects of the first, for kubectl apply (validated against the CRDs' schemas in
	// package k8s's tests).
	y := mustShed(t, builder, "k8s", "manifests", "--image", host+"/shed:one", "--runtime-class", "runc", "--replicas", "2", one).stdout
	for _, want := range []string{"kind: SandboxTemplate", "kind: SandboxWarmPool", "image: " + host + "/shed:one", "workingDir: /work", "runtimeClassName: runc", "replicas: 2", "value: hello from a Workshop"} {
		if !strings.Contains(y, want) {
			t.Errorf("k8s manifests: no %q in\n%s", want, y)
		}
	}
	oneLayers, onePaths := imageLayers(t, reg, "shed", "one")
	twoLayers, twoPaths := imageLayers(t, reg, "shed", "two")
	if len(onePaths) != 2 || onePaths[0] != twoPaths[0] || onePaths[1] == twoPaths[1] || onePaths[0] == "" {
		t.Fatalf("the images' layers should be the shared seed and one layer each: %v %v", onePaths, twoPaths)
	}
	seedPath := onePaths[0]

	nodeRoot := newRoot(t)
	mustShed(t, nodeRoot, "key", "trust", strings.TrimSpace(mustShed(t, builder, "key", "export").stdout))
	cfg := filepath.Join(nodeRoot, "config.toml")
	writeFile(t, cfg, string(must(os.ReadFile(cfg)))+fmt.Sprintf("substituters = [%q]\n", cacheURL))
	n := startNode(t, nodeRoot, reg)

	// The first Workshop: its paths come from the cache; none of the image's layers is downloaded.
	_, mark := access.blobs(0)
	n.mustCrictl("pull", host+"/shed:one")
	first, mark := access.blobs(mark)
	for _, d := range append(oneLayers, twoLayers...) {
		if _, ok := first[d]; ok {
			t.Errorf("pull one downloaded the image layer %s: the snapshotter should have had it from the store", d)
		}
	}
	for _, p := range onePaths {
		base := filepath.Base(p)
		if !strings.Contains(mustShed(t, nodeRoot, "store", "ls").stdout, base) {
			t.Errorf("%s is not in the node's store after the pull", base)
		}
	}
	// The second: only its own layer's cache artifact; nothing of the seed's.
	n.mustCrictl("pull", host+"/shed:two")
	second, _ := access.blobs(mark)
	var movedSeed, moved int64
	for d, size := range second {
		moved += size
		if _, ok := first[d]; ok {
			movedSeed += size
			t.Errorf("pull two fetched %s (%d bytes) again, which pull one had fetched: the seed is shared", d, size)
		}
	}
	for _, d := range twoLayers {
		if _, ok := second[d]; ok {
			t.Errorf("pull two downloaded the image layer %s", d)
		}
	}
	t.Logf("pull one fetched %d blobs; pull two %d blobs, %d bytes, %d of them the seed's", len(first), len(second), moved, movedSeed)

	// A pod on runc, a container of each image, a command in each.
	pod, podCfg := n.pod("workshops", "runc")
	c1 := n.container(pod, podCfg, "one", host+"/shed:one")
	c2 := n.container(pod, podCfg, "two", host+"/shed:two")
	if out := n.mustCrictl("exec", c1, "sh", "-c", `jq -n '1+41'; echo "$GREETING"; pwd`); out != "42\nhello from a Workshop\n/work" {
		t.Errorf("exec in the first Workshop's container: %q", out)
	}
	if out := n.mustCrictl("exec", c2, "tree", "--version"); !strings.Contains(out, "tree v") {
		t.Errorf("exec in the second Workshop's container: %q", out)
	}
	// The container's writes go to its upper, never to a store path.
	n.mustCrictl("exec", c1, "sh", "-c", "echo debris > /usr/bin/jq-debris && rm /usr/bin/jq")
	if r := shed(t, nodeRoot, nil, "store", "verify", "--check-contents"); r.code != 0 || !strings.Contains(r.stdout, "0 problems") {
		t.Errorf("the node's store after a container's writes: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// crictl rmi of the first image, then shed gc, while its container runs: its own layer (which no
	// other image has) stays, and so does the seed.
	n.mustCrictl("rmi", host+"/shed:one")
	gcKeeps := func(when string) {
		t.Helper()
		mustShed(t, nodeRoot, "gc")
		ls := mustShed(t, nodeRoot, "store", "ls").stdout
		for _, p := range []string{onePaths[1], seedPath} {
			if !strings.Contains(ls, filepath.Base(p)) {
				t.Errorf("gc %s removed %s, which a running container uses", when, filepath.Base(p))
			}
		}
		// Its jq layer's library (its /usr/bin/jq it removed itself, above), and its upper's file.
		if out := n.mustCrictl("exec", c1, "sh", "-c", "ls /usr/lib/*/libjq.so.1 >/dev/null && cat /usr/bin/jq-debris"); out != "debris" {
			t.Errorf("exec in the first image's container, gc %s: %q", when, out)
		}
	}
	gcKeeps("after rmi")

	// The snapshotter restarts under running containers (its cleanup at start keeps every root its
	// records hold: gc still keeps what they use); a new container of an image still comes up.
	n.stopSnapshotter()
	n.startSnapshotter()
	gcKeeps("after the snapshotter's restart")
	c3 := n.container(pod, podCfg, "two-again", host+"/shed:two")
	if out := n.mustCrictl("exec", c3, "sh", "-c", "ls /usr/bin/tree"); out != "/usr/bin/tree" {
		t.Errorf("a container after the snapshotter's restart: %q", out)
	}

	// crun as the runtime handler of a second pod.
	// And the image removed above, pulled again: its snapshots are still there.
	_, mark = access.blobs(0)
	n.mustCrictl("pull", host+"/shed:one")
	if again, _ := access.blobs(mark); len(again) > 1 {
		t.Errorf("pulling an image again whose snapshots are there fetched %d blobs, want its config at most", len(again))
	}
	pod2, pod2Cfg := n.pod("crun", "crun")
	c4 := n.container(pod2, pod2Cfg, "crun-one", host+"/shed:one")
	if out := n.mustCrictl("exec", c4, "jq", "-n", "6*7"); out != "42" {
		t.Errorf("exec on crun: %q", out)
	}

	// Bad images. Each is refused at the snapshotter's prepare, containerd reports the reason, and
	// the node's store still verifies.
	lie := tarLayer(t, &tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, &tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "root::0:0::/:/bin/sh\n"})
	pushImageWith(t, auth.EmptyCredential, host+"/bad:lie", ispec.ImageConfig{}, []map[string]string{{"containerd.io/snapshot/dev.toolshed.path": seedPath}}, lie)
	missing := strings.Replace(seedPath, filepath.Base(seedPath)[:32], strings.Repeat("0", 32), 1)
	pushImageWith(t, auth.EmptyCredential, host+"/bad:missing", ispec.ImageConfig{}, []map[string]string{{"containerd.io/snapshot/dev.toolshed.path": missing}}, lie)
	for tag, want := range map[string]string{
		"lie":     "the image does not match the path it names",
		"missing": "is not in this node's store or in its substituters",
	} {
		r := n.crictl("pull", host+"/bad:"+tag)
		if r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("pull of the %s image: exit %d, want an error with %q\n%s", tag, r.code, want, r.stderr)
		}
	}
	// A path signed by a key the node does not trust.
	other := newRoot(t)
	src := filepath.Join(t.TempDir(), "tree")
	writeFile(t, filepath.Join(src, "etc", "motd"), "from a store the node does not trust\n")
	added := strings.TrimSpace(mustShed(t, other, "store", "add", src).stdout)
	mustShed(t, other, "copy", "--to", cacheURL, added)
	untrusted := pushStorePathImage(t, other, host+"/bad:untrusted", added)
	if r := n.crictl("pull", host+"/bad:untrusted"); r.code == 0 || !strings.Contains(r.stderr, "not signed by a trusted key") {
		t.Errorf("pull of an image of an untrusted path: exit %d\n%s", r.code, r.stderr)
	}
	if strings.Contains(mustShed(t, nodeRoot, "store", "ls").stdout, filepath.Base(untrusted)) {
		t.Errorf("the untrusted path was registered in the node's store")
	}
	if r := shed(t, nodeRoot, nil, "store", "verify", "--check-contents"); r.code != 0 || !strings.Contains(r.stdout, "0 problems") {
		t.Errorf("the node's store after the bad images: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A key containerd never prepared: NotFound, through containerd's own snapshot service.
	ctr := exec.Command("ctr", "--address", n.sock, "-n", "k8s.io", "snapshots", "--snapshotter", "shed", "mounts", "/mnt", "never-prepared")
	if out, err := ctr.CombinedOutput(); err == nil || !strings.Contains(string(out), "not found") {
		t.Errorf("mounts of a key never prepared: %v\n%s", err, out)
	}

	// Removing the pods and images releases the snapshots' gc roots: gc may then take the paths.
	n.mustCrictl("stopp", pod)
	n.mustCrictl("rmp", pod)
	if r := n.crictl("pods", "-q"); r.code == 0 {
		for _, id := range strings.Fields(r.stdout) {
			n.crictl("stopp", id)
			n.crictl("rmp", id)
		}
	}
	n.mustCrictl("rmi", host+"/shed:one", host+"/shed:two")
	deadline := time.Now().Add(30 * time.Second)
	for {
		roots := mustShed(t, nodeRoot, "root", "ls").stdout
		if !strings.Contains(roots, "containerd-") {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the snapshots' gc roots are still there after their images and pods are gone:\n%s", roots)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pushStorePathImage pushes an image of the one store path full from the store at root (the image a
// `shed copy --image` of a Workshop of that path would be) and returns the path.
func pushStorePathImage(t testing.TB, root, ref, full string) string {
	t.Helper()
	st, err := store.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := store.ParsePath(filepath.Base(full))
	if err != nil {
		t.Fatal(err)
	}
	repo, tag, _ := strings.Cut(ref, ":")
	if i := strings.LastIndex(ref, ":"); i > 0 {
		repo, tag = ref[:i], ref[i+1:]
	}
	cc, err := cache.Open("oci://" + repo)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.PushImage(context.Background(), st, cc, tag, []store.Path{p}, cache.ImageConfig{}); err != nil {
		t.Fatal(err)
	}
	return full
}
