package tests

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sweTasks is the synthetic set's shape: SWE-bench's environment images are a few repositories at
// many commits, each image one base (the OS and a toolchain) plus the repository's checkout and the
// packages its tests need. Here: 4 repositories at 5 commits each (a commit changes a twentieth of
// the files), and each task 3 of 6 packages.
const (
	sweRepos     = 4
	sweCommits   = 5
	sweRepoFiles = 300  // files of a checkout
	sweFileSize  = 4096 // bytes each, about
	swePackages  = 6
	swePkgFiles  = 120
	swePkgFile   = 8192
)

// sweContent is deterministic filler: the same seed gives the same bytes.
func sweContent(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	const alphabet = "abcdefghijklmnopqrstuvwxyz _\n(),.=:0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return b
}

// sweTaskLayer is task (repo, commit)'s layer: the checkout at /testbed and three packages.
func sweTaskLayer(t testing.TB, repo, commit int) testLayer {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	add := func(name string, body []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)), ModTime: sweEpoch}); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	for f := range sweRepoFiles {
		// A file changes at the commits past the one it changed at: a twentieth of them per commit.
		rev := 0
		for c := 1; c <= commit; c++ {
			if (f+c*7)%20 == 0 {
				rev = c
			}
		}
		add(fmt.Sprintf("testbed/repo%d/pkg%d/mod%d.py", repo, f%10, f), sweContent(uint64(repo*1_000_000+f*100+rev), sweFileSize))
	}
	add("etc/task-id", fmt.Appendf(nil, "repo %d commit %d\n", repo, commit))
	for k := range 3 {
		p := (repo + commit + k*2) % swePackages
		for f := range swePkgFiles {
			add(fmt.Sprintf("usr/local/lib/python3.11/dist-packages/dep%d/file%d.py", p, f), sweContent(uint64(50_000_000+p*1000+f), swePkgFile))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return gzipLayer(t, b.Bytes())
}

var sweEpoch = time.Unix(1_700_000_000, 0)

// BenchmarkSWEBenchStore: the store's disk use for a SWE-bench-shaped set realized as 20 templates
// through the real `e2b` SDK, against the images' own size. One base image (Debian's seed) and 20
// task images over it in a loopback registry; each template is a seed of its image, a path holding
// the base's files and the task's, so without files stored once the store would hold 20 copies of the
// base. Reported: store/images (the store's bytes, store/ and links/, hard links counted once, after
// gc, against the sum of the images' uncompressed layers, what SWE-bench's 206 GiB counts),
// copies/images (what the same paths would take as copies) and store/registry (against the
// registry's compressed blobs, shared layers once). One measurement, whatever b.N.
func BenchmarkSWEBenchStore(b *testing.B) {
	requireRoot(b)
	base := debianLayer(b, sharedRoot(b))
	reg := startRegistry(b, "")
	var images, names []string
	var imagesBytes int64
	for repo := range sweRepos {
		for commit := range sweCommits {
			task := sweTaskLayer(b, repo, commit)
			ref := fmt.Sprintf("127.0.0.1:%d/swe/repo%d:c%d", reg.port, repo, commit)
			pushImage(b, ref, base, task)
			images, names = append(images, ref), append(names, fmt.Sprintf("swe-repo%d-c%d", repo, commit))
			imagesBytes += base.size + task.size
		}
	}
	root := newRoot(b)
	addr := freeLoopback(b)
	sock, _ := daemonWith(b, root, "--e2b", addr)
	var k struct{ Key string }
	if err := json.Unmarshal([]byte(via(b, sock, 0, "", "--json", "agent", "key", "create", "root").stdout), &k); err != nil {
		b.Fatal(err)
	}
	dir := npmPackage(b, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-swe.mjs")
	writeFile(b, client, string(must(os.ReadFile("testdata/e2b-swe.mjs"))))
	args := []string{client}
	for i := range images {
		args = append(args, images[i], names[i])
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if i > 0 {
			continue // one measurement: a second round would find every template built
		}
		cmd := exec.Command("node", args...)
		cmd.Env = append(os.Environ(), "HOME=/", "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+k.Key)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("the harness: %v\n%s", err, out)
		}
	}
	b.StopTimer()
	via(b, sock, 0, "", "gc")
	var st struct {
		Size  int64
		Links struct{ Saved int64 }
	}
	json.Unmarshal([]byte(via(b, sock, 0, "", "--json", "store", "info").stdout), &st)
	storeBytes := duApparent(b, filepath.Join(root, "store"), filepath.Join(root, "links"))
	regBytes := duApparent(b, reg.dir)
	b.ReportMetric(float64(storeBytes)/float64(imagesBytes), "store/images")
	b.ReportMetric(float64(st.Size)/float64(imagesBytes), "copies/images")
	b.ReportMetric(float64(storeBytes)/float64(regBytes), "store/registry")
	if os.Getenv("SHED_BENCH_DEBUG") != "" {
		out, _ := exec.Command("sh", "-c", "cd "+root+"/store && du -sb * | sort -n | tail -8; du -sb "+root+"/links; find "+root+"/store -maxdepth 1 | wc -l").CombinedOutput()
		b.Logf("largest paths:\n%s", out)
	}
	b.Logf("20 task images: %d MB as images (uncompressed layers), %d MB in the registry; the store %d MB on disk, %d MB as copies (saved by files stored once: %d MB)",
		imagesBytes>>20, regBytes>>20, storeBytes>>20, st.Size>>20, st.Links.Saved>>20)
}

// duApparent is the apparent size of the trees, each hard-linked file once (du counts an inode once
// per run).
func duApparent(t testing.TB, dirs ...string) int64 {
	out, err := exec.Command("du", append([]string{"-scb"}, dirs...)...).Output()
	if err != nil {
		t.Fatalf("du: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	var total int64
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[1] == "total" {
			total, _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	return total
}
