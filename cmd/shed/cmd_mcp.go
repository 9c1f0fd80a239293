package main

import (
	"github.com/urfave/cli/v2"
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
		Action: mcpServe, // serve.go
	}
}
