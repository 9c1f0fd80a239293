package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"toolshed.dev/shed/api"
	"toolshed.dev/shed/app"
)

// BenchmarkAgentCreate is what an agent harness pays for a Bench through the API: bench.create of a
// realized Workshop (the supervisor's warm pool has inits ready), bench.exec of /bin/true with its
// output captured, bench.rm; against the C launch floor (../shared/bench/floor.c: namespaces, the
// same two layers as an overlay, pivot_root, exec /bin/true), in the same run. Then 32 creates at
// once: each one's time, p50 and p95.
func BenchmarkAgentCreate(b *testing.B) {
	requireRoot(b)
	root := sharedRoot(b)
	sock := daemon(b, root)
	dir := b.TempDir()
	name := fmt.Sprintf("agentbench-%d", os.Getpid())
	file := writeFile(b, filepath.Join(dir, "workshop.toml"), fmt.Sprintf("name = %q\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n", name))
	layers := realize(b, root, file).Layers
	if r := via(b, sock, 0, "", "workshop", "add", file); r.code != 0 {
		b.Fatal(r.stderr)
	}
	floorSrc := "../../shared/bench/floor.c"
	if _, err := os.Stat(floorSrc); err != nil {
		floorSrc = "../sandbox/testdata/floor.c"
	}
	floor := filepath.Join(dir, "floor")
	if out, err := exec.Command("gcc", "-O2", "-o", floor, floorSrc).CombinedOutput(); err != nil {
		b.Fatalf("gcc: %v %s", err, out)
	}
	os.MkdirAll(filepath.Join(dir, "floorwd"), 0o755)
	b.Run("floor", func(b *testing.B) {
		for b.Loop() {
			cmd := exec.Command(floor, filepath.Join(dir, "floorwd"), layers[1]+":"+layers[0], "/bin/true")
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("floor: %v %s", err, out)
			}
		}
	})
	cl := &api.Client{Socket: sock}
	once := func(ctx context.Context) error {
		var c app.BenchCreateResult
		if err := cl.Call(ctx, "bench.create", &app.BenchCreateRequest{Workshop: name, LifetimeS: 300, Net: "none"}, &c); err != nil {
			return err
		}
		var x app.ExecResult
		if err := cl.Call(ctx, "bench.exec", &app.BenchExecRequest{Bench: c.Bench, Argv: []string{"/bin/true"}, Capture: true}, &x); err != nil || x.Exit != 0 {
			return fmt.Errorf("exec: %v %+v", err, x)
		}
		return cl.Call(ctx, "bench.rm", &app.BenchRemoveRequest{Benches: []string{c.Bench}}, nil)
	}
	b.Run("api-steps", func(b *testing.B) {
		var tc, tx, tr time.Duration
		for b.Loop() {
			t0 := time.Now()
			var c app.BenchCreateResult
			if err := cl.Call(context.Background(), "bench.create", &app.BenchCreateRequest{Workshop: name, LifetimeS: 300, Net: "none"}, &c); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			var x app.ExecResult
			if err := cl.Call(context.Background(), "bench.exec", &app.BenchExecRequest{Bench: c.Bench, Argv: []string{"/bin/true"}, Capture: true}, &x); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			if err := cl.Call(context.Background(), "bench.rm", &app.BenchRemoveRequest{Benches: []string{c.Bench}}, nil); err != nil {
				b.Fatal(err)
			}
			tc, tx, tr = tc+t1.Sub(t0), tx+t2.Sub(t1), tr+time.Since(t2)
		}
		n := time.Duration(b.N)
		b.ReportMetric(float64((tc/n).Microseconds())/1000, "create-ms")
		b.ReportMetric(float64((tx/n).Microseconds())/1000, "exec-ms")
		b.ReportMetric(float64((tr/n).Microseconds())/1000, "rm-ms")
	})
	b.Run("api-create-exec-rm", func(b *testing.B) {
		for b.Loop() {
			if err := once(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("api-32-at-once", func(b *testing.B) {
		var all []time.Duration
		for b.Loop() {
			var mu sync.Mutex
			var wg sync.WaitGroup
			var errs []string
			for range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					err := once(context.Background())
					mu.Lock()
					defer mu.Unlock()
					all = append(all, time.Since(start))
					if err != nil {
						errs = append(errs, err.Error())
					}
				}()
			}
			wg.Wait()
			if len(errs) > 0 {
				b.Fatalf("%d of 32 failed: %s", len(errs), strings.Join(errs[:min(3, len(errs))], "; "))
			}
		}
		sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
		b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(all[len(all)*95/100].Microseconds())/1000, "p95-ms")
	})
}
