package main

import (
	"context"
	"os"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/api"
	"toolshed.dev/shed/app"
	"toolshed.dev/shed/mcp"
)

func cmdMCP() *cli.Command {
	return &cli.Command{
		Name:  "mcp",
		Usage: "serve the Model Context Protocol on stdio: an agent host gets Benches from the supervisor, as you",
		Description: "An MCP server (stdio) for agent hosts: coding agents, IDEs, any MCP client. Each tool is a\n" +
			"request to the supervisor (SHED_SOCKET, as for every command), made as the user who started\n" +
			"`shed mcp`, with that user's roles and limits: the Workshops a record allows you, your own\n" +
			"Benches only. Tools: workshop_list, bench_create, bench_exec, bench_write_file,\n" +
			"bench_read_file, bench_list_files, bench_stat_file, bench_watch_start, bench_watch_events,\n" +
			"bench_watch_stop, bench_network, bench_set_lifetime, bench_list, bench_metrics, bench_remove,\n" +
			"bench_propose. See docs/agents.md.",
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError("mcp takes no arguments")
			}
			null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer null.Close()
			// stdin and stdout are the protocol's: the supervisor gets /dev/null for them, and the
			// commands' output comes back in results.
			stdio := &[3]*os.File{null, null, os.Stderr}
			hosts := app.HostPaths{Root: storeRoot(c), Socket: os.Getenv(api.SocketEnv)}
			if hosts.Socket == "" || hosts.Socket == "none" {
				hosts.Socket = api.DefaultSocket
			}
			s := &mcp.Server{
				Version: version,
				Hosts:   hosts,
				Call: func(ctx context.Context, op string, req, resp any) error {
					return callInto(ctx, c, stdio, "mcp", op, req, resp)
				},
			}
			return s.Run(c.Context, &sdk.StdioTransport{})
		},
	}
}
