package main

import (
	"github.com/urfave/cli/v2"
)

// defaultSnapshotterSocket is where containerd's proxy_plugins entry finds the snapshotter.
const defaultSnapshotterSocket = "/run/toolshed/snapshotter.sock"

func cmdSnapshotter() *cli.Command {
	return &cli.Command{
		Name:  "snapshotter",
		Usage: "serve containerd's snapshots API from the store: Workshop images' layers mounted from store paths, never downloaded",
		Description: "Listens on SOCKET (default " + defaultSnapshotterSocket + ", mode 0600) for containerd, which names it\n" +
			"in its config as a proxy plugin of type \"snapshot\" (docs/kubernetes.md has the config and the\n" +
			"systemd unit). A layer of an image made by `shed copy --image` names its store path: the\n" +
			"snapshotter makes the path valid (from the store's substituters, signed by a trusted key, when\n" +
			"it is missing), checks that the path is the layer the image says, holds it with a gc root\n" +
			"while containerd keeps the snapshot, and tells containerd the layer is there, so it downloads\n" +
			"nothing. Other images' layers are unpacked by containerd into DIR, as its overlayfs\n" +
			"snapshotter does. A container's filesystem is one overlay of the store paths and one upper.\n" +
			"Runs as root on the store directly (not through the supervisor), beside it.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: defaultSnapshotterSocket, Usage: "the socket's `PATH`"},
			&cli.StringFlag{Name: "dir", Usage: "where its records, unpacked layers and uppers live (`DIR`, default: <root>/containerd)"},
		},
		Action: snapshotterServe, // serve.go
	}
}
