package sandbox_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"toolshed.dev/shed/sandbox"
)

// TestReadUsage runs a sandbox with Account and no limit that writes 32 MiB in its tmpfs upper and
// keeps a cpu busy for 2 s (of which 2 cores shared with other tests give it at least 0.1 s), and reads
// what it uses: the cpu time, the memory (the tmpfs's pages are
// the writer's) and the upper's disk are there. Without Account, there is nothing to read.
func TestReadUsage(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	run := func(account bool) (sandbox.Usage, error) {
		stdinR, stdinW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer stdinW.Close()
		outR, outW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer outR.Close()
		spec := tmpfsSpec(t, "sh", "-c", `dd if=/dev/zero of=/root/big bs=1M count=32 2>/dev/null || exit 1
			end=$(($(date +%s)+2)); while [ $(date +%s) -le $end ]; do :; done; echo ready; read x`)
		spec.Account = account
		p, err := sandbox.Start(context.Background(), spec, sandbox.Stdio{Stdin: stdinR, Stdout: outW, Stderr: outW})
		stdinR.Close()
		outW.Close()
		if err != nil {
			t.Fatal(err)
		}
		defer p.Wait()
		defer stdinW.Close()
		if sc := bufio.NewScanner(outR); !sc.Scan() || sc.Text() != "ready" {
			t.Fatalf("got %q, want ready", sc.Text())
		}
		u, err := sandbox.ReadUsage(p.Pid)
		if account && err == nil {
			// What the supervisor pays a running Bench every 5 s.
			start := time.Now()
			for range 100 {
				sandbox.ReadUsage(p.Pid)
			}
			first := time.Since(start) / 100
			r, err := sandbox.NewUsageReader(p.Pid)
			if err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			for range 100 {
				r.Read()
			}
			t.Logf("a reading takes %v, %v with the cgroups found before", first, time.Since(start)/100)
		}
		return u, err
	}
	u, err := run(true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", u)
	if u.CPUCount < 1 || u.CPUNanos < int64(100*time.Millisecond) || u.MemUsed < 32<<20 || u.MemTotal < u.MemUsed ||
		u.DiskUsed < 32<<20 || u.DiskTotal < u.DiskUsed {
		t.Errorf("usage of a sandbox that wrote 32 MiB and ran 2 s: %+v", u)
	}
	if _, err := run(false); !errors.Is(err, sandbox.ErrNoUsage) {
		t.Errorf("without Account: %v, want ErrNoUsage", err)
	}
}
