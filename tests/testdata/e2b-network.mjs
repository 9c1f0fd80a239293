// Per-sandbox network rules through the unmodified `e2b` SDK: rules at create, updateNetwork, bad
// updates that change nothing, and an update that cuts connections already open. Destinations are the
// test host's: A (allowed by the Workshop's profile, reached at create), B (denied at create). One JSON
// object per step on stdout, for the Go test to check.
import { Sandbox, ALL_TRAFFIC } from "e2b";

const [template, A, B, outside] = process.argv.slice(2);
const out = (step, value) => console.log(JSON.stringify({ step, value }));
const attempt = async (step, fn) => {
  try {
    out(step, { ok: true, value: await fn() });
  } catch (e) {
    out(step, { ok: false, error: `${e.name}: ${e.message}` });
  }
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A rule outside the recipe's network profile: refused, no sandbox made.
await attempt("refused-create", async () => {
  const s = await Sandbox.create(template, { network: { denyOut: [ALL_TRAFFIC], allowOut: [outside] } });
  await s.kill();
  return "created";
});

let sandbox;
await attempt("create", async () => {
  sandbox = await Sandbox.create(template, { timeoutMs: 600_000, network: { denyOut: [B] } });
  return sandbox.sandboxId;
});
if (!sandbox) process.exit(0);

// What A and B answer now: the body, or the proxy's status.
const reach = async () => (await sandbox.commands.run(
  `for h in ${A} ${B}; do curl -s -w ' %{http_code}\\n' http://$h:8000/fast; done`)).stdout;
await attempt("create-rules", reach);
await attempt("info", async () => (await sandbox.getInfo()).network);

// Two connections that stay open: a slow response through the proxy, and the same through a CONNECT
// tunnel (curl -p). Each writes its body as it comes and its exit code when it ends.
await attempt("open", async () => {
  for (const [name, flags] of [["fwd", ""], ["tun", "-p"]]) {
    await sandbox.commands.run(`curl -sS -N ${flags} -o /tmp/${name}.body http://${A}:8000/slow 2>/tmp/${name}.err; echo $? > /tmp/${name}.rc`, { background: true });
  }
  for (let i = 0; i < 100; i++) {
    const r = await sandbox.commands.run("stat -c %s /tmp/fwd.body /tmp/tun.body 2>/dev/null || true");
    const sizes = r.stdout.trim().split("\n").map(Number);
    if (sizes.length === 2 && sizes.every((n) => n > 0)) return "open";
    await sleep(100);
  }
  throw new Error("the slow connections did not start");
});

// Bad updates: each refused with its reason, nothing changed.
await attempt("bad-cidr", () => sandbox.updateNetwork({ denyOut: ["8.8.8.8/33"] }));
await attempt("bad-profile", () => sandbox.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: [A, outside] }));
await attempt("bad-many", () => sandbox.updateNetwork({
  denyOut: Array.from({ length: 10000 }, (_, i) => `203.0.${i >> 8}.${i & 255}`),
}));
await attempt("bad-transform", () => sandbox.updateNetwork({ rules: { [A]: [{ transform: { headers: { X: "y" } } }] } }));
await attempt("still", async () => {
  const open = (await sandbox.commands.run("ls /tmp/fwd.rc /tmp/tun.rc 2>/dev/null | wc -l")).stdout.trim();
  return { rcFiles: open, reach: await reach() };
});

// The update: only B. Both open connections lead to A: cut, long before the 120 s of /slow.
await attempt("update", async () => {
  const t0 = Date.now();
  await sandbox.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: [B] });
  for (let i = 0; i < 100; i++) {
    const r = await sandbox.commands.run("cat /tmp/fwd.rc /tmp/tun.rc 2>/dev/null || true");
    const rcs = r.stdout.trim().split("\n").filter((s) => s !== "");
    if (rcs.length === 2) return { rcs, cutWithin5s: Date.now() - t0 < 5000 };
    await sleep(100);
  }
  throw new Error("the open connections were not cut");
});
await attempt("after-update", reach);
await attempt("info-after", async () => (await sandbox.getInfo()).network);
// E2B: a field left out is cleared; the profile alone is left.
await attempt("clear", async () => { await sandbox.updateNetwork({}); return reach(); });
await attempt("internet-off", async () => { await sandbox.updateNetwork({ allowInternetAccess: false }); return reach(); });
// The test reads the Bench's network log and the audit log while it runs, then says go.
out("hold", sandbox.sandboxId);
for await (const _ of process.stdin) break;
await attempt("kill", () => sandbox.kill());
