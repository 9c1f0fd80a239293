// A harness that watches what its sandbox uses, through the unmodified `e2b` SDK: getMetrics with
// and without a range, before and after work that moves the figures (cpu, memory, the disk of what
// is written in the sandbox), the bad ranges, and E2B's /sandboxes/metrics for many sandboxes. It
// prints one JSON object per step on stdout, for the Go test to check; a step that throws prints its
// error instead. After "hold" it waits for a line on stdin (the Go test reads the same Bench through
// `shed bench ls` and MCP), then kills the sandbox.
import { Sandbox } from "e2b";
import { createInterface } from "node:readline";

const [template] = process.argv.slice(2);
const out = (step, value) => console.log(JSON.stringify({ step, value }));
const attempt = async (step, fn) => {
  try {
    const value = await fn();
    out(step, { ok: true, value });
    return value;
  } catch (e) {
    out(step, { ok: false, error: `${e.name}: ${e.message}` });
    return undefined;
  }
};
const wait = (ms) => new Promise((r) => setTimeout(r, ms));
const api = async (path) => {
  const r = await fetch(process.env.E2B_API_URL + path, { headers: { "X-API-Key": process.env.E2B_API_KEY } });
  return { status: r.status, body: await r.json() };
};
// poll calls fn every 500 ms until it returns a value, for at most 40 s.
const poll = async (fn) => {
  for (let i = 0; i < 80; i++) {
    const v = await fn();
    if (v !== undefined) return v;
    await wait(500);
  }
  throw new Error("not within 40 s");
};

const sandbox = await Sandbox.create(template, { timeoutMs: 600_000 });
const id = sandbox.sandboxId;
out("create", { ok: true, value: id });
const created = new Date();

const first = await attempt("first", () => poll(async () => {
  const m = await sandbox.getMetrics();
  return m.length > 0 ? m : undefined;
}));
const before = first?.at(-1);

// Work: 64 MiB written in the sandbox (its upper: disk), 64 MiB held by a process that stays (memory),
// and 7 s of a busy cpu.
const start = new Date();
await attempt("work", async () => (await sandbox.commands.run(
  "head -c 67108864 /dev/zero > /root/big && " +
  "(sh -c 'x=$(head -c 67108864 /dev/zero | tr \\\\0 a); sleep 600' >/dev/null 2>&1 &) && " +
  "{ timeout 7 sh -c 'while :; do :; done'; echo busy; }")).stdout);
const moved = await attempt("moved", () => poll(async () => {
  const m = await sandbox.getMetrics({ start, end: new Date() });
  const disk = m.some((x) => x.diskUsed >= before.diskUsed + 60 * 1024 * 1024);
  const mem = m.some((x) => x.memUsed >= before.memUsed + 48 * 1024 * 1024);
  // An idle Bench's is 0 to 0.2 %; a busy loop on 2 cores shared with other tests gets 1 s or more of 5.
  const cpu = m.some((x) => x.cpuUsedPct >= 3);
  return disk && mem && cpu ? m : undefined;
}));
out("range", { ok: true, value: { start: start.getTime(), end: Date.now(), samples: moved?.map((x) => x.timestamp.getTime()) } });
await attempt("all", async () => (await sandbox.getMetrics()).map((x) => ({ ...x, timestamp: x.timestamp.getTime() })));
await attempt("before-it-existed", () => sandbox.getMetrics({
  start: new Date(created.getTime() - 60 * 60 * 1000), end: new Date(created.getTime() - 30 * 60 * 1000),
}));
await attempt("ten-years", async () => (await sandbox.getMetrics({
  start: new Date(Date.now() - 10 * 365 * 86400 * 1000), end: new Date(Date.now() + 10 * 365 * 86400 * 1000),
})).length);
await attempt("backwards", () => sandbox.getMetrics({ start: new Date(), end: new Date(Date.now() - 3600_000) }));
await attempt("not-a-number", () => api(`/sandboxes/${id}/metrics?start=yesterday`));
await attempt("negative", () => api(`/sandboxes/${id}/metrics?end=-5`));
await attempt("huge", () => api(`/sandboxes/${id}/metrics?start=0&end=99999999999999`));
await attempt("many", () => api(`/sandboxes/metrics?sandbox_ids=${id},no-such-sandbox`));
await attempt("too-many", () => api(`/sandboxes/metrics?sandbox_ids=${Array.from({ length: 101 }, (_, i) => "s" + i).join(",")}`));
await attempt("none", () => api(`/sandboxes/metrics`));
await attempt("unknown", () => Sandbox.getMetrics("no-such-sandbox"));

out("hold", id);
const rl = createInterface({ input: process.stdin });
for await (const _ of rl) break;
await attempt("kill", () => sandbox.kill());
await attempt("after-kill", () => api(`/sandboxes/${id}/metrics`));
