package fdio

import (
	"context"
	"io"
	"os"
	"testing"
	"time"
)

// TestReaderEnds: a read of a pipe whose writer stays open and silent ends when the context does.
func TestReaderEnds(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(Reader(ctx, r))
		done <- err
	}()
	w.Write([]byte("some"))
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ReadAll: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the read outlived its context")
	}
}

// TestWriterEnds: a write to a full pipe nobody reads ends with the context; with a drop deadline it
// drops instead of waiting.
func TestWriterEnds(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	defer r.Close()
	big := make([]byte, 1<<20) // more than a pipe holds
	n, err := Writer(context.Background(), w, 200*time.Millisecond).Write(big)
	if err != nil || n != len(big) {
		t.Errorf("a dropping writer: %d, %v", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Writer(ctx, w, 0).Write(big); err == nil || time.Since(start) > 2*time.Second {
		t.Errorf("a write to a full pipe: %v after %v, want the context's end", err, time.Since(start))
	}
	// And what fits is written whole.
	r2, w2, _ := os.Pipe()
	defer r2.Close()
	go func() { Writer(context.Background(), w2, 0).Write([]byte("hello, world")); w2.Close() }()
	if b, _ := io.ReadAll(r2); string(b) != "hello, world" {
		t.Errorf("read back %q", b)
	}
}
