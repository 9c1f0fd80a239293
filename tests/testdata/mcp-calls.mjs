// An MCP host that makes the tool calls it is given: the official TypeScript SDK's client, driving
// `shed mcp` over stdio. argv: shed, then a JSON list of [step, tool, arguments]; it prints one JSON
// object per call on stdout, for the Go test to check.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [shed, calls] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: shed, args: ["mcp"], env: process.env, stderr: "inherit" });
const client = new Client({ name: "shed-test", version: "1.0.0" });
await client.connect(transport);
for (const [step, name, args] of JSON.parse(calls)) {
  const r = await client.callTool({ name, arguments: args });
  const value = { error: r.isError === true, data: r.structuredContent ?? null, text: (r.content ?? []).map((c) => c.text).join("") };
  console.log(JSON.stringify({ step, value }));
}
await client.close();
