// An MCP host as agent harnesses are: the official TypeScript SDK's client, driving `shed mcp` over
// stdio. It prints one JSON object per step on stdout, for the Go test to check.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [shed, workshop, pkg] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: shed, args: ["mcp"], env: process.env, stderr: "inherit" });
const client = new Client({ name: "shed-test", version: "1.0.0" });
await client.connect(transport);

const out = (step, value) => console.log(JSON.stringify({ step, value }));
const call = async (name, args) => {
  const r = await client.callTool({ name, arguments: args });
  return { error: r.isError === true, data: r.structuredContent ?? null, text: (r.content ?? []).map((c) => c.text).join("") };
};

out("tools", (await client.listTools()).tools.map((t) => t.name).sort());
out("workshops", await call("workshop_list", {}));
const created = await call("bench_create", { workshop, lifetime_s: 600 });
out("create", created);
const bench = created.data.bench;
out("install", await call("bench_exec", {
  bench, command: ["sh", "-c", `apt-get -qq update >/dev/null && apt-get -qq install -y --no-install-recommends ${pkg} >/dev/null && echo installed`],
  timeout_s: 300,
}));
out("write", await call("bench_write_file", { bench, path: "/root/work/run.sh", content: `${pkg} > /root/work/out.txt\necho "ran in $PWD with $GREETING"\n` }));
out("run", await call("bench_exec", { bench, command: ["sh", "run.sh"], cwd: "/root/work", env: { GREETING: "hi" } }));
out("read", await call("bench_read_file", { bench, path: "/root/work/out.txt" }));
out("ls", await call("bench_list_files", { bench, path: "/root/work" }));
out("stat", await call("bench_stat_file", { bench, path: "/root/work/out.txt" }));
out("stat-missing", await call("bench_stat_file", { bench, path: "/root/nothing" }));
out("timeout", await call("bench_exec", { bench, command: ["sleep", "30"], timeout_s: 1 }));
out("list", await call("bench_list", {}));
out("propose", await call("bench_propose", { bench }));
out("remove", await call("bench_remove", { bench }));
out("list-after", await call("bench_list", {}));
out("missing", await call("bench_exec", { bench, command: ["true"] }));
out("not-allowed", await call("bench_create", { workshop: "no-such-workshop" }));
const short = await call("bench_create", { workshop, lifetime_s: 2 });
out("short", short);
await new Promise((r) => setTimeout(r, 5000));
out("short-after", await call("bench_list", {}));
await client.close();
