package main

import (
	"github.com/urfave/cli/v2"
)

func cmdK8s() *cli.Command {
	return &cli.Command{
		Name:  "k8s",
		Usage: "Kubernetes: a Workshop as agent-sandbox objects",
		Subcommands: []*cli.Command{{
			Name:      "manifests",
			Usage:     "print a Workshop's SandboxTemplate and SandboxWarmPool (agent-sandbox v1beta1) as YAML for kubectl apply",
			ArgsUsage: "--image REF [WORKSHOP]",
			Description: "WORKSHOP is a record or a recipe file (default ./workshop.toml); REF is its image, as\n" +
				"`shed copy --to oci://HOST/REPO --image TAG WORKSHOP` pushed it (HOST/REPO:TAG, or @DIGEST to pin it).\n" +
				"The template's pod runs REF with the Workshop's [env] and workdir; its network policy allows the\n" +
				"addresses the Workshop's profile allows. A NetworkPolicy names addresses, never host names:\n" +
				"with --egress-proxy IP:PORT (an allowlisting HTTP proxy) the pods reach only it for the allowed\n" +
				"names and their clients are pointed at it; without one those names are unreachable, and said\n" +
				"so on stderr. docs/kubernetes.md has the node's side (containerd, `shed snapshotter`).",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "image", Required: true, Usage: "the Workshop's image `REF`"},
				&cli.StringFlag{Name: "name", Usage: "the objects' `NAME` (default: the Workshop's)"},
				&cli.StringFlag{Name: "namespace", Usage: "the objects' `NAMESPACE`"},
				&cli.StringFlag{Name: "runtime-class", Usage: "the pods' runtimeClassName (`NAME`, e.g. gvisor or kata)"},
				&cli.IntFlag{Name: "replicas", Value: 1, Usage: "the warm pool's size, `N` pods ready"},
				&cli.StringFlag{Name: "cpu", Usage: "each pod's cpu request and limit (`QUANTITY`, e.g. 2 or 500m)"},
				&cli.StringFlag{Name: "memory", Usage: "each pod's memory request and limit (`QUANTITY`, e.g. 4Gi)"},
				&cli.StringFlag{Name: "egress-proxy", Usage: "`IP:PORT` of the allowlisting proxy pods reach allowed host names through"},
			},
			Action: k8sManifests, // serve.go
		}},
	}
}
