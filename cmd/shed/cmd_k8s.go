package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
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
			Action: func(c *cli.Context) error {
				if c.NArg() > 1 {
					return usageError("k8s manifests takes one WORKSHOP")
				}
				res, err := call[app.K8sManifestsResult](c, "k8s.manifests", &app.K8sManifestsRequest{
					Workshop: c.Args().First(), Image: c.String("image"), Name: c.String("name"), Namespace: c.String("namespace"),
					RuntimeClass: c.String("runtime-class"), Replicas: int32(c.Int("replicas")), CPU: c.String("cpu"),
					Memory: c.String("memory"), EgressProxy: c.String("egress-proxy"),
				})
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c, res)
				}
				if len(res.Unreachable) > 0 {
					fmt.Fprintf(c.App.ErrWriter, "shed: warning: a NetworkPolicy cannot name hosts: %s unreachable from the pods; --egress-proxy IP:PORT lets them through an allowlisting proxy\n", strings.Join(res.Unreachable, ", "))
				}
				fmt.Fprint(c.App.Writer, res.YAML)
				return nil
			},
		}},
	}
}
