// pause is the sandbox image's one program for tests/containerd_test.go (a pod's infrastructure
// container, as registry.k8s.io/pause is, which this machine cannot reach): it waits until it is
// told to stop.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
