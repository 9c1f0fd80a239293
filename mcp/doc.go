// Package mcp serves the Model Context Protocol (the official Go SDK) for agent hosts: coding
// agents, IDEs, any MCP client. Each tool is one typed operation of package app, made through the
// Caller it is given (cmd/shed's `shed mcp` gives it the supervisor's socket, or the store it opens),
// as the user who started the server: this package translates tools to operations and results back,
// and decides nothing of who may do what (package policy does, on the supervisor's side).
//
// It is one face beside api/ (the socket) and e2b/ (the E2B API): what an agent may do through MCP
// is what it may do through them, named for an agent. docs/agents.md lists the tools.
package mcp
