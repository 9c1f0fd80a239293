// The branching tools through the official MCP TypeScript SDK's client, driving `shed mcp` over
// stdio: pause, resume, snapshots, a Bench of a snapshot, fork and reset. One JSON object a step.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [shed, workshop] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: shed, args: ["mcp"], env: process.env, stderr: "inherit" });
const client = new Client({ name: "shed-branch-test", version: "1.0.0" });
await client.connect(transport);

const out = (step, value) => console.log(JSON.stringify({ step, value }));
const call = async (name, args) => {
  const r = await client.callTool({ name, arguments: args });
  return { error: r.isError === true, data: r.structuredContent ?? null, text: (r.content ?? []).map((c) => c.text).join("") };
};
const cat = (bench) => call("bench_exec", { bench, command: ["cat", "/root/mark"] });

out("tools", (await client.listTools()).tools.map((t) => t.name).sort());
const created = await call("bench_create", { workshop, lifetime_s: 600, on_timeout: "pause" });
out("create", created);
const bench = created.data?.bench;
out("write", await call("bench_exec", { bench, command: ["sh", "-c", "echo mcp > /root/mark"] }));
out("pause", await call("bench_pause", { bench }));
out("exec-paused", await call("bench_exec", { bench, command: ["true"] }));
out("list-paused", await call("bench_list", {}));
out("resume", await call("bench_resume", { bench, lifetime_s: 600 }));
out("resume-again", await call("bench_resume", { bench }));
out("snapshot", await call("snapshot_create", { bench, name: "mcp-snap" }));
out("snapshots", await call("snapshot_list", { name: "mcp-snap" }));
out("create-both", await call("bench_create", { workshop, snapshot: "mcp-snap" }));
const of = await call("bench_create", { snapshot: "mcp-snap", lifetime_s: 600 });
out("create-snap", of);
out("cat-snap", await cat(of.data?.bench));
const fork = await call("bench_fork", { bench, count: 1, lifetime_s: 600 });
out("fork", fork);
out("cat-fork", await cat(fork.data?.children?.[0]?.bench));
out("fork-bad", await call("bench_fork", { bench, count: 101 }));
out("reset", await call("bench_reset", { bench }));
out("cat-reset", await cat(bench));
out("reset-snap", await call("bench_reset", { bench, snapshot: "mcp-snap" }));
out("cat-reset-snap", await cat(bench));
out("rm-snap", await call("snapshot_remove", { snapshot: "mcp-snap" }));
out("rm-snap-again", await call("snapshot_remove", { snapshot: "mcp-snap" }));
for (const b of [bench, of.data?.bench, fork.data?.children?.[0]?.bench]) {
  if (b) await call("bench_remove", { bench: b });
}
await client.close();
