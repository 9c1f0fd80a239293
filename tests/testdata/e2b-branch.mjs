// A harness that branches its sandboxes through the unmodified `e2b` SDK: pause and connect with a
// process counting across (it stops while paused, goes on after), files kept; a fork of 2 that sees
// a file written just before, each child its own; snapshots made, listed, started from and deleted;
// a sandbox that pauses at its timeout (autoPause) and wakes by connect. It prints one JSON object
// per step on stdout, for the Go test to check; a step that throws prints its error instead.
import { Sandbox } from "e2b";

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
const api = async (method, path, body) => {
  const r = await fetch(process.env.E2B_API_URL + path, {
    method,
    headers: { "X-API-Key": process.env.E2B_API_KEY, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: r.status, body: await r.text() };
};
const count = async (sbx) => Number((await sbx.files.read("/opt/count")).trim());

const sbx = await Sandbox.create(template, { timeoutMs: 600_000 });
const id = sbx.sandboxId;
out("create", { ok: true, value: id });
await sbx.files.write("/opt/state.txt", "kept across a pause");
const counter = await sbx.commands.run("i=0; while :; do i=$((i+1)); echo $i > /opt/count; sleep 0.1; done", { background: true });
await wait(1000);

// Pause: the counter stops, the sandbox reads as stopped, a second pause is E2B's "already".
await attempt("pause", async () => {
  const before = await count(sbx);
  const paused = await sbx.pause();
  const again = await Sandbox.pause(id);
  const running = await sbx.isRunning();
  const info = await sbx.getInfo();
  const listedPaused = (await Sandbox.list({ query: { state: ["paused"] } }).nextItems()).map((s) => s.sandboxId);
  const listedRunning = (await Sandbox.list({ query: { state: ["running"] } }).nextItems()).map((s) => s.sandboxId);
  let run;
  try {
    run = `ran: ${(await sbx.commands.run("true")).exitCode}`;
  } catch (e) {
    run = `${e.name}: ${e.message}`;
  }
  await wait(1500);
  const endIn = Math.round((info.endAt.getTime() - Date.now()) / 1000);
  return { before, paused, again, running, state: info.state, endIn, lifecycle: info.lifecycle, inPaused: listedPaused.includes(id), inRunning: listedRunning.includes(id), run };
});
// Connect resumes it: the counter goes on from where it stopped.
await attempt("connect", async () => {
  const resumed = await Sandbox.connect(id, { timeoutMs: 600_000 });
  const running = await resumed.isRunning();
  const at = await count(resumed);
  await wait(1000);
  const later = await count(resumed);
  const listed = (await resumed.commands.list()).some((p) => p.pid === counter.pid);
  const state = (await resumed.getInfo()).state;
  const kept = await resumed.files.read("/opt/state.txt");
  const again = await api("POST", `/sandboxes/${id}/connect`, { timeout: 600 });
  return { running, at, later, listed, state, kept, againStatus: again.status };
});

// Fork 2: each sees the file written just before, and is its own.
await attempt("fork", async () => {
  await sbx.files.write("/opt/fork.txt", "written just before the fork");
  const forks = await sbx.fork({ count: 2, timeoutMs: 120_000 });
  const kids = forks.filter((f) => f instanceof Sandbox);
  const seen = await Promise.all(kids.map((k) => k.files.read("/opt/fork.txt")));
  await kids[0].files.write("/opt/fork.txt", "changed in a child");
  const parent = await sbx.files.read("/opt/fork.txt");
  const other = await kids[1].files.read("/opt/fork.txt");
  const running = await Promise.all(kids.map((k) => k.isRunning()));
  const ids = kids.map((k) => k.sandboxId);
  await Promise.all(kids.map((k) => k.kill()));
  return { n: forks.length, ids, seen, parent, other, running, parentRunning: await sbx.isRunning() };
});
await attempt("fork-bad", async () => {
  const zero = await api("POST", `/sandboxes/${id}/fork`, { count: 0 });
  const many = await api("POST", `/sandboxes/${id}/fork`, { count: 101 });
  return { zero, many };
});

// Snapshots: made, listed (by sandbox, by name), a sandbox started from one (that one pauses at
// its short timeout, and wakes by connect), deleted once.
const snapName = `snap-${process.pid}`;
const snap = await attempt("snapshot", async () => {
  await sbx.files.write("/opt/state.txt", "as the snapshot sealed it");
  return await sbx.createSnapshot({ name: snapName });
});
await sbx.files.write("/opt/state.txt", "after the snapshot");
await attempt("snapshot-list", async () => {
  const bySandbox = (await sbx.listSnapshots().nextItems()).map((s) => s.snapshotId);
  const byName = (await Sandbox.listSnapshots({ name: snapName }).nextItems()).map((s) => s.snapshotId);
  const none = await Sandbox.listSnapshots({ name: `${snapName}-none` }).nextItems();
  return { bySandbox, byName, none: none.length };
});
await attempt("from-snapshot", async () => {
  const child = await Sandbox.create(snap.snapshotId, { timeoutMs: 4_000, lifecycle: { onTimeout: "pause" } });
  const read = await child.files.read("/opt/state.txt");
  const info = await child.getInfo();
  await wait(7000);
  const after = await child.getInfo();
  const runningAfter = await child.isRunning();
  await Sandbox.connect(child.sandboxId, { timeoutMs: 60_000 });
  const woke = await child.isRunning();
  const readAgain = await child.files.read("/opt/state.txt");
  await child.kill();
  return { read, template: info.templateId, lifecycle: info.lifecycle, stateAfter: after.state, runningAfter, woke, readAgain };
});
await attempt("snapshot-delete", async () => {
  const first = await Sandbox.deleteSnapshot(snap.snapshotId);
  const second = await Sandbox.deleteSnapshot(snap.snapshotId);
  const listed = (await Sandbox.listSnapshots({ name: snapName }).nextItems()).length;
  return { first, second, listed };
});

// A filesystem-only pause (keepMemory false), at the timeout's end and by a call: the processes end,
// the files stay, and connect boots it again (a new boot id); a pause that keeps memory keeps the boot
// id. Auto-resume cannot wake a cold pause: the SDK refuses it, and the API too (400).
await attempt("cold-pause", async () => {
  const bootOf = async (s) => (await s.commands.run("cat /proc/sys/kernel/random/boot_id")).stdout.trim();
  const cold = await Sandbox.create(template, { timeoutMs: 3_000, lifecycle: { onTimeout: { action: "pause", keepMemory: false } } });
  await cold.files.write("/opt/cold.txt", "on disk");
  await cold.commands.run("sleep 1000", { background: true });
  const boot0 = await bootOf(cold);
  await wait(5_500);
  const info = await cold.getInfo();
  await Sandbox.connect(cold.sandboxId, { timeoutMs: 60_000 });
  const read = await cold.files.read("/opt/cold.txt");
  const sleepers = (await cold.commands.run("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null | grep -c '^sleep 1000' || true")).stdout.trim();
  const boot1 = await bootOf(cold);
  await cold.pause();
  await cold.connect();
  const boot2 = await bootOf(cold);
  await cold.pause({ keepMemory: false });
  await cold.connect();
  const boot3 = await bootOf(cold);
  await cold.kill();
  const refused = await api("POST", "/sandboxes", { templateID: template, timeout: 30, autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } });
  return { state: info.state, onTimeout: info.lifecycle?.onTimeout, read, sleepers, newBoot: boot1 !== boot0 && boot1.length === 36, warmKeeps: boot2 === boot1, coldAgain: boot3 !== boot2, refused: refused.status };
});

// A paused sandbox is killed as a running one is.
await attempt("kill-paused", async () => {
  await sbx.pause();
  const killed = await Sandbox.kill(id);
  let after;
  try {
    await Sandbox.connect(id);
    after = "connected";
  } catch (e) {
    after = e.name;
  }
  return { killed, after };
});
out("done", { ok: true });
