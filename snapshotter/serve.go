package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
)

// Serve answers containerd on a unix socket at socket until ctx ends, after a Cleanup. The socket is made 0600:
// whoever reaches it chooses what a node's containers mount.
func (sn *Snapshotter) Serve(ctx context.Context, socket string) error {
	// What a crash left (a directory or a gc root whose record never committed) goes before the
	// first request: nothing is in flight yet.
	if _, err := sn.Cleanup(ctx, &snapshotsapi.CleanupRequest{}); err != nil {
		return fmt.Errorf("clean up %s: %w", sn.Dir, err)
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// Made 0600 as it is made (the umask, for this one call): no connection waits in its backlog
	// from before a chmod.
	old := unix.Umask(0o177)
	l, err := net.Listen("unix", socket)
	unix.Umask(old)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		l.Close()
		return err
	}
	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, sn)
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	err = srv.Serve(l)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}
