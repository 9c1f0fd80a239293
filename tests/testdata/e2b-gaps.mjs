// The E2B SDK's behaviours that only the SDK shows, against shed (TestE2BGaps): list's pages, order
// and startedAfter; connect that never shortens a timeout; isRunning of an ended sandbox; a command
// of a sandbox killed while it runs; entries as envd gives them; refusals in E2B's shape. One JSON
// object per step on stdout; a step that throws prints its error instead.
import { Sandbox } from "e2b";

const [template] = process.argv.slice(2);
const api = process.env.E2B_API_URL;
const key = process.env.E2B_API_KEY;
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
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const raw = async (method, path, body) => {
  const r = await fetch(api + path, {
    method, headers: { "X-API-Key": key, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
};

const run = `gaps-${process.pid}`;
const metadata = { run };
let a, b;
await attempt("create", async () => {
  a = await Sandbox.create(template, { timeoutMs: 300_000, metadata });
  b = await Sandbox.create(template, { timeoutMs: 300_000, metadata });
  return [a.sandboxId, b.sandboxId];
});
if (!a || !b) process.exit(0);

await attempt("pages", async () => {
  const p = Sandbox.list({ limit: 1, query: { metadata, state: ["running"] } });
  const pages = [];
  while (p.hasNext) {
    pages.push((await p.nextItems()).map((s) => s.sandboxId));
    if (pages.length > 3) break;
  }
  return pages; // newest first: [[b], [a]]
});
await attempt("order", async () => {
  const asc = await Sandbox.list({ order: "asc", query: { metadata } }).nextItems();
  const desc = await Sandbox.list({ order: "desc", query: { metadata } }).nextItems();
  return { asc: asc.map((s) => s.sandboxId), desc: desc.map((s) => s.sandboxId) };
});
await attempt("started-after", async () => {
  const started = (await b.getInfo()).startedAt;
  return (await Sandbox.list({ query: { metadata, startedAfter: started } }).nextItems()).map((s) => s.sandboxId);
});

await attempt("connect-keeps", async () => {
  const before = (await a.getInfo()).endAt.getTime();
  await Sandbox.connect(a.sandboxId, { timeoutMs: 10_000 });
  // The path of the SDK's releases that do not say /v2.
  const plain = await raw("POST", `/sandboxes/${a.sandboxId}/connect`, { timeout: 10 });
  const after = (await a.getInfo()).endAt.getTime();
  await Sandbox.connect(a.sandboxId, { timeoutMs: 600_000 });
  const extended = (await a.getInfo()).endAt.getTime();
  return { kept: before === after, plain: plain.status, plainEnd: new Date(plain.body.endAt).getTime() === before, extended: extended > before };
});

await attempt("entries", async () => {
  await a.files.makeDir("/root/gaps");
  await a.files.write("/root/gaps/f.txt", "data");
  await a.commands.run("cd /root/gaps && ln -s f.txt link && ln -s nowhere dangling && ln -s /root/gaps up");
  const dir = await a.files.getInfo("/root/gaps");
  const link = await a.files.getInfo("/root/gaps/link");
  const dangling = await a.files.getInfo("/root/gaps/dangling");
  const listed = Object.fromEntries((await a.files.list("/root/gaps")).map((e) => [e.name, { type: e.type, mode: e.mode, target: e.symlinkTarget }]));
  return {
    dir: { type: dir.type, mode: dir.mode, permissions: dir.permissions },
    link: { type: link.type, mode: link.mode, target: link.symlinkTarget, permissions: link.permissions },
    dangling: { target: dangling.symlinkTarget },
    listed,
  };
});
await attempt("remove-missing", async () => {
  await a.files.remove("/root/gaps/not-there");
  await a.files.remove("/root/gaps/f.txt");
  return a.files.exists("/root/gaps/f.txt");
});

await attempt("refusals", async () => ({
  volumes: await raw("GET", "/volumes"),
  unknown: await raw("GET", "/no/such/route"),
}));

await attempt("killed-during-run", async () => {
  const cmd = await b.commands.run("sleep 60", { background: true });
  await b.kill();
  try {
    await cmd.wait();
    return "exited";
  } catch (e) {
    return `${e.name}: ${e.message}`;
  }
});
await attempt("killed-is-running", async () => b.isRunning());
await attempt("connect-killed", async () => {
  try {
    await Sandbox.connect(b.sandboxId);
    return "connected";
  } catch (e) {
    return e.name;
  }
});
await attempt("fork-killed", async () => {
  try {
    await Sandbox.fork(b.sandboxId);
    return "forked";
  } catch (e) {
    return e.name;
  }
});
await attempt("pause-killed", async () => (await raw("POST", `/sandboxes/${b.sandboxId}/pause`)).status);

await attempt("shorten", async () => {
  const before = await a.isRunning();
  await a.setTimeout(2_000);
  await sleep(4_000);
  return { before, after: await a.isRunning() };
});
