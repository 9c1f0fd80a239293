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

// File metadata: kept with a write, shown by stat and ls; a bad key writes nothing.
out("write-meta", await call("bench_write_file", { bench, path: "/root/work/meta.txt", content: "m\n", metadata: { author: "agent", "run-id": "42" } }));
out("stat-meta", await call("bench_stat_file", { bench, path: "/root/work/meta.txt" }));
out("ls-meta", await call("bench_list_files", { bench, path: "/root/work" }));
out("write-meta-bad", await call("bench_write_file", { bench, path: "/root/work/bad.txt", content: "x", metadata: { "a key": "v" } }));
out("stat-meta-bad", await call("bench_stat_file", { bench, path: "/root/work/bad.txt" }));

// Accounts: the Workshop declares `agent` (and no default user: commands run as root unless told).
out("exec-agent", await call("bench_exec", { bench, command: ["sh", "-c", "id -un; echo $HOME; pwd"], user: "agent" }));
out("write-agent", await call("bench_write_file", { bench, path: "/home/agent/notes/a.txt", content: "a\n", user: "agent" }));
out("stat-agent", await call("bench_stat_file", { bench, path: "/home/agent/notes/a.txt" }));
out("stat-agent-dir", await call("bench_stat_file", { bench, path: "/home/agent/notes" }));
out("exec-unknown-user", await call("bench_exec", { bench, command: ["true"], user: "mallory" }));

// Watches, polled: a missing directory and a watcher id that is not one are refused.
out("watch-missing", await call("bench_watch_start", { bench, path: "/root/nothere" }));
const watch = await call("bench_watch_start", { bench, path: "/root/work", recursive: true });
out("watch-start", watch);
const watcher = watch.data?.watcher;
await call("bench_exec", { bench, command: ["sh", "-c", "echo a > /root/work/new.txt && mkdir /root/work/sub && rm /root/work/meta.txt"] });
const seen = { error: false, events: [] };
for (let i = 0; i < 50 && !seen.events.some((e) => e.name === "meta.txt" && e.type === "remove"); i++) {
  const r = await call("bench_watch_events", { bench, watcher });
  if (r.error) { seen.error = r; break; }
  seen.events.push(...r.data.events);
  await new Promise((r) => setTimeout(r, 100));
}
out("watch-events", seen);
out("watch-events-bad", await call("bench_watch_events", { bench, watcher: "wnotawatcher" }));
out("watch-stop-bad", await call("bench_watch_stop", { bench, watcher: "wnotawatcher" }));
out("watch-stop", await call("bench_watch_stop", { bench, watcher }));
out("watch-events-stopped", await call("bench_watch_events", { bench, watcher }));
out("watch-left", await call("bench_watch_start", { bench, path: "/root" })); // held when the Bench is removed
// A Bench holds at most 16 watchers: the 17th is refused, and the Bench works on.
const more = [];
for (let i = 0; i < 16; i++) more.push(await call("bench_watch_start", { bench, path: "/root/work" }));
out("watch-bound", { errors: more.filter((r) => r.error).map((r) => r.text), after: await call("bench_exec", { bench, command: ["true"] }) });

// Network rules, within the Workshop's profile: a rule outside it changes nothing.
out("net-show", await call("bench_network", { bench }));
out("net-deny", await call("bench_network", { bench, allow_internet_access: false }));
out("net-bad", await call("bench_network", { bench, allow_out: ["example.com"] }));
out("net-after-bad", await call("bench_network", { bench }));
out("net-denied", await call("bench_exec", { bench, command: ["sh", "-c", "apt-get -qq update 2>&1 || echo update-failed"], timeout_s: 120 }));
out("net-clear", await call("bench_network", { bench, clear: true }));
out("list", await call("bench_list", {}));
out("propose", await call("bench_propose", { bench }));
out("remove", await call("bench_remove", { bench }));
out("list-after", await call("bench_list", {}));
out("missing", await call("bench_exec", { bench, command: ["true"] }));
out("not-allowed", await call("bench_create", { workshop: "no-such-workshop" }));
out("create-net-bad", await call("bench_create", { workshop, name: "mcp-net-bad", allow_out: ["example.com"] }));
const short = await call("bench_create", { workshop, lifetime_s: 600, deny_out: ["0.0.0.0/0"] });
out("short", short);
out("short-net", await call("bench_network", { bench: short.data?.bench }));
out("lifetime-bad", await call("bench_set_lifetime", { bench: short.data?.bench, lifetime_s: 100000 }));
out("lifetime", await call("bench_set_lifetime", { bench: short.data?.bench, lifetime_s: 2 }));
await new Promise((r) => setTimeout(r, 5000));
out("short-after", await call("bench_list", {}));
await client.close();
