package tests

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// BenchmarkContainerdPull is a node's pull to first exec of a Workshop's image, side by side in one
// run, interleaved, each round from the image's absence (crictl rmi, and containerd's gc of its
// content and snapshots): through shed's snapshotter with a warm store (the node's store has the
// paths; nothing is downloaded), through containerd's own overlayfs snapshotter (the same image as
// plain layers: downloaded from the loopback registry and unpacked), and `shed bench run` of the
// same Workshop on the store (the launch a single machine does). Reported as ratios to the bench
// run and to containerd's overlayfs.
func BenchmarkContainerdPull(b *testing.B) {
	requireRoot(b)
	root := sharedRoot(b)
	reg, _ := startLoggedRegistry(b)
	host := fmt.Sprintf("127.0.0.1:%d", reg.port)
	pauseImage(b, reg)
	file := writeFile(b, filepath.Join(b.TempDir(), "workshop.toml"), jqRecipe)
	realize(b, root, file)
	mustShed(b, root, "copy", "--to", reg.url("shed"), "--image", "jq", file)
	image := host + "/shed:jq"

	shedNode := startNodeWith(b, root, reg, "shed")
	plainNode := startNodeWith(b, root, reg, "overlayfs")
	pods := map[*node][2]string{}
	for _, n := range []*node{shedNode, plainNode} {
		id, cfg := n.pod("bench", "runc")
		pods[n] = [2]string{id, cfg}
	}
	round := 0
	steps := map[*node]map[string][]time.Duration{shedNode: {}, plainNode: {}}
	pullToExec := func(n *node) time.Duration {
		round++
		n.crictl("rmi", image)
		start := time.Now()
		lap := start
		step := func(name string) {
			now := time.Now()
			steps[n][name] = append(steps[n][name], now.Sub(lap))
			lap = now
		}
		n.mustCrictl("pull", image)
		step("pull")
		c := n.container(pods[n][0], pods[n][1], fmt.Sprintf("c%d", round), image)
		step("create+start")
		n.mustCrictl("exec", c, "true")
		step("exec")
		d := time.Since(start)
		n.mustCrictl("rm", "-f", c)
		return d
	}
	benchRun := func() time.Duration {
		start := time.Now()
		mustShed(b, root, "bench", "run", "-f", file, "--", "true")
		return time.Since(start)
	}
	var viaShed, viaPlain, run []time.Duration
	pullToExec(shedNode) // first rounds: the diff IDs computed, the blobs in the registry's cache
	pullToExec(plainNode)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		viaShed = append(viaShed, pullToExec(shedNode))
		viaPlain = append(viaPlain, pullToExec(plainNode))
		run = append(run, benchRun())
	}
	b.StopTimer()
	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(med(viaShed)), "shed-snapshotter-ms")
	b.ReportMetric(ms(med(viaPlain)), "overlayfs-ms")
	b.ReportMetric(ms(med(run)), "bench-run-ms")
	b.ReportMetric(float64(med(viaShed))/float64(med(run)), "x-bench-run")
	b.ReportMetric(float64(med(viaShed))/float64(med(viaPlain)), "x-overlayfs")
	for n, name := range map[*node]string{shedNode: "shed", plainNode: "overlayfs"} {
		for _, st := range []string{"pull", "create+start", "exec"} {
			b.ReportMetric(ms(med(steps[n][st])), name+"-"+st+"-ms")
		}
	}
	b.Logf("pull to first exec, medians of %d rounds: shed's snapshotter %.0f ms, containerd's overlayfs %.0f ms; shed bench run %.0f ms (%s)",
		b.N, ms(med(viaShed)), ms(med(viaPlain)), ms(med(run)), strings.TrimSpace(fmt.Sprint(len(viaShed))))
}
