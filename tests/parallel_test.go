package tests

import (
	"flag"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// parallel is how a heavy test runs in parallel (see parallelTests in main_test.go): t.Parallel,
// then one of the package's slots, handed out longest first.
//
// Why not go test's own limit: it lets the paused tests go in no particular order, so a test of
// seven minutes could start last and hold the whole run up alone for its length. The slots are
// as many as -parallel says (TestMain reads it, then lifts go test's own limit, which this takes
// over); the tests of longestFirst get them first, then the rest in the order they came.
func parallel(t *testing.T) {
	t.Parallel()
	slots.acquire(t.Name())
	t.Cleanup(slots.release)
}

// longestFirst are the heavy tests that take longest, longest first, as measured
// (go test -v ./tests: the --- PASS lines' times). A test not named here starts after these.
var longestFirst = []string{
	"TestBenchWork", "TestReadmeBlocks", "TestRootless", "TestBuildCrashAtEveryStep",
	"TestPipRealizeCounts", "TestReadmeExample", "TestReproducibleFromEmptyStores", "TestPipWorkshop",
	"TestHostilePackages", "TestNoSpace", "TestRootlessBesideDaemon", "TestPipPackageNotThere",
	"TestSupervisorLoop", "TestRepair", "TestCachePrewarm",
}

// gather is how long the first test to ask waits for the others before any slot is given: go
// test lets all the paused tests go at once, and they ask within microseconds of each other.
const gather = 200 * time.Millisecond

type slotSet struct {
	mu      sync.Mutex
	cond    *sync.Cond
	free    int
	open    bool           // the first arrivals have been gathered
	waiting map[string]int // by test name: its rank (its place in longestFirst, else after them in arrival order)
	arrived int
}

var slots = &slotSet{free: 4, waiting: map[string]int{}}

// slotsFromFlags takes -parallel as the number of slots and lifts go test's own limit (TestMain,
// after flag.Parse and before m.Run).
func slotsFromFlags() {
	slots.cond = sync.NewCond(&slots.mu)
	if f := flag.Lookup("test.parallel"); f != nil {
		if n, err := strconv.Atoi(f.Value.String()); err == nil && n > 0 {
			slots.free = n
		}
		f.Value.Set("1000")
	}
}

func (s *slotSet) acquire(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rank := slices.Index(longestFirst, name)
	if rank < 0 {
		rank = len(longestFirst) + s.arrived
	}
	s.arrived++
	s.waiting[name] = rank
	if s.arrived == 1 {
		time.AfterFunc(gather, func() {
			s.mu.Lock()
			s.open = true
			s.cond.Broadcast()
			s.mu.Unlock()
		})
	}
	for !s.open || s.free == 0 || !s.first(name) {
		s.cond.Wait()
	}
	s.free--
	delete(s.waiting, name)
	s.cond.Broadcast() // the next in rank may take another free slot
}

// first says whether name has the best rank of the waiting tests.
func (s *slotSet) first(name string) bool {
	for _, r := range s.waiting {
		if r < s.waiting[name] {
			return false
		}
	}
	return true
}

func (s *slotSet) release() {
	s.mu.Lock()
	s.free++
	s.cond.Broadcast()
	s.mu.Unlock()
}

// TestHeavyTestsTakeASlot: every parallel test of the package goes through parallel, so that the
// slots bound them all (a bare t.Parallel would run beside them, unbounded).
func TestHeavyTestsTakeASlot(t *testing.T) {
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	bare := regexp.MustCompile(`\bt\.Parallel\(\)`)
	for _, f := range files {
		if f.IsDir() || f.Name() == "parallel_test.go" {
			continue
		}
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if n := len(bare.FindAll(b, -1)); n > 0 {
			t.Errorf("%s calls t.Parallel() %d times: call parallel(t) instead (tests/parallel_test.go)", f.Name(), n)
		}
	}
}
