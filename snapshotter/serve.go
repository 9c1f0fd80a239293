package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"google.golang.org/grpc"
)

// Serve answers containerd on a unix socket at socket until ctx ends. The socket is made 0600:
// whoever reaches it chooses what a node's containers mount.
func (sn *Snapshotter) Serve(ctx context.Context, socket string) error {
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l, err := net.Listen("unix", socket)
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
