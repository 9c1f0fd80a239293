// envd's surface beyond commands and files, through the unmodified `e2b` package as a harness uses
// it: pseudo-terminals, directory watches, file metadata and signals, and bad input against each.
// One JSON object per step on stdout ({"step", "value": {ok, value} or {ok: false, error}}).
import { Sandbox, FilesystemEventType } from "e2b";

const [template, hostDir] = process.argv.slice(2);
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
// until waits for cond, at most ms.
const until = async (cond, ms = 10_000) => {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(50)) if (cond()) return true;
  return cond();
};
const bytes = (s) => new Uint8Array(Buffer.from(s));

const sandbox = await Sandbox.create(template, { timeoutMs: 600_000 });
out("create", { ok: true, value: { id: sandbox.sandboxId } });

// A terminal: input, its size told at create and changed, a second connection after the first ended.
await attempt("pty", async () => {
  let first = "";
  const t = await sandbox.pty.create({ cols: 80, rows: 24, envs: { ABC: "123" }, onData: (d) => { first += Buffer.from(d).toString(); } });
  await sandbox.pty.sendInput(t.pid, bytes("echo A$ABC; tput cols; tty\n"));
  await until(() => first.includes("A123") && /[\r\n]80\r?\n/.test(first));
  await sandbox.pty.resize(t.pid, { cols: 100, rows: 30 });
  await sandbox.pty.sendInput(t.pid, bytes("tput cols; tput lines\n"));
  // Both answers, in order: waiting for the first alone read the output before `tput lines` had run.
  await until(() => /[\r\n]100\r?\n30\r?\n/.test(first));
  await t.disconnect();
  let second = "";
  const again = await sandbox.pty.connect(t.pid, { onData: (d) => { second += Buffer.from(d).toString(); } });
  await sandbox.pty.sendInput(t.pid, bytes("echo B$ABC\nexit\n"));
  await again.wait();
  return {
    pid: t.pid === again.pid, exit: again.exitCode, abc: first.includes("A123"), cols80: /[\r\n]80\r?\n/.test(first),
    cols100: /[\r\n]100\r?\n/.test(first), lines30: /[\r\n]30\r?\n/.test(first), tty: /\/dev\/pts\/\d+/.test(first), second: second.includes("B123"),
  };
});

// A huge write to a terminal is refused whole; the terminal and the sandbox go on.
await attempt("pty-huge", async () => {
  let seen = "";
  const t = await sandbox.pty.create({ cols: 80, rows: 24, onData: (d) => { seen += Buffer.from(d).toString(); } });
  const errors = [];
  for (const n of [2 << 20, 8 << 20]) {
    try {
      await sandbox.pty.sendInput(t.pid, new Uint8Array(n).fill(120));
      errors.push("accepted");
    } catch (e) {
      errors.push(`${e.name}: ${e.message}`);
    }
  }
  await sandbox.pty.sendInput(t.pid, bytes("echo still-here\nexit\n"));
  await t.wait();
  return { errors, alive: seen.includes("still-here"), exit: t.exitCode, run: (await sandbox.commands.run("echo ok")).stdout };
});

await attempt("pty-kill", async () => {
  const t = await sandbox.pty.create({ cols: 80, rows: 24, onData: () => {} });
  const killed = await sandbox.pty.kill(t.pid);
  let end;
  try {
    await t.wait();
    end = `exit ${t.exitCode}`;
  } catch (e) {
    end = `${e.name}: ${e.message}`;
  }
  return { killed, end, again: await sandbox.pty.kill(t.pid), none: await sandbox.pty.kill(999999) };
});

// A recursive watch with entries: a file written, a directory made after the watch began, a file in it.
await attempt("watch", async () => {
  await sandbox.files.makeDir("/root/w");
  const events = [];
  const h = await sandbox.files.watchDir("/root/w", (e) => { events.push({ type: e.type, name: e.name, entry: e.entry && { path: e.entry.path, type: e.entry.type } }); },
    { recursive: true, includeEntry: true });
  await sandbox.files.write("/root/w/a.txt", "a");
  await sandbox.files.makeDir("/root/w/sub");
  await until(() => events.some((e) => e.type === FilesystemEventType.CREATE && e.name === "sub"));
  await sandbox.files.write("/root/w/sub/b.txt", "b");
  await sandbox.commands.run("rm /root/w/a.txt");
  await until(() => events.some((e) => e.name === "sub/b.txt" && e.type === FilesystemEventType.WRITE) && events.some((e) => e.name === "a.txt" && e.type === FilesystemEventType.REMOVE));
  await h.stop();
  const find = (type, name) => events.find((e) => e.type === type && e.name === name);
  return { created: find(FilesystemEventType.CREATE, "a.txt"), nested: find(FilesystemEventType.WRITE, "sub/b.txt"), removed: find(FilesystemEventType.REMOVE, "a.txt") };
});

await attempt("watch-missing", async () => sandbox.files.watchDir("/root/no-such-dir", () => {}));
await attempt("watch-file", async () => { await sandbox.files.write("/root/plain.txt", "x"); return sandbox.files.watchDir("/root/plain.txt", () => {}); });
// A symlink in the Bench to a directory that exists only on the host leads nowhere.
await attempt("watch-escape", async () => {
  await sandbox.commands.run(`ln -s ${hostDir} /root/host-link`);
  return sandbox.files.watchDir("/root/host-link", () => {});
});
// The whole tree: refused with a reason, or watched within the bounds; the sandbox goes on either way.
await attempt("watch-root", async () => {
  const res = {};
  for (const recursive of [false, true]) {
    try {
      const h = await sandbox.files.watchDir("/", () => {}, { recursive });
      await h.stop();
      res[recursive ? "recursive" : "top"] = "watched";
    } catch (e) {
      res[recursive ? "recursive" : "top"] = `${e.name}: ${e.message}`;
    }
  }
  res.after = (await sandbox.commands.run("echo ok")).stdout;
  return res;
});

// The polled watcher RPCs (the Python SDK's watch_dir; the JS SDK has no call for them): entries
// when asked; past 4096 events not taken it ends, its events given first, and answers its end until
// removed, as envd's; a removed one is gone.
await attempt("watcher", async () => {
  const rpc = async (m, body) => {
    const r = await fetch(`${process.env.E2B_SANDBOX_URL}/filesystem.Filesystem/${m}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Access-Token": sandbox.envdAccessToken, "E2b-Sandbox-Id": sandbox.sandboxId },
      body: JSON.stringify(body),
    });
    const j = await r.json();
    return r.ok ? j : { error: `${j.code}: ${j.message}` };
  };
  await sandbox.files.makeDir("/root/pw");
  const { watcherId, error } = await rpc("CreateWatcher", { path: "/root/pw", includeEntry: true });
  if (error) throw new Error(error);
  await sandbox.files.write("/root/pw/a.txt", "a");
  const events = [];
  for (let i = 0; i < 100 && !events.some((e) => e.type === "EVENT_TYPE_CREATE"); i++, await sleep(50)) {
    events.push(...((await rpc("GetWatcherEvents", { watcherId })).events ?? []));
  }
  const c = events.find((e) => e.type === "EVENT_TYPE_CREATE");
  await sandbox.commands.run("cd /root/pw && i=0; while [ $i -lt 6000 ]; do : > f$i; i=$((i+1)); done");
  await sleep(1000);
  let taken = 0, end;
  for (;;) {
    const r = await rpc("GetWatcherEvents", { watcherId });
    if (r.error || !r.events?.length) { end = r.error ?? "no end"; break; }
    taken += r.events.length;
  }
  const again = (await rpc("GetWatcherEvents", { watcherId })).error;
  const stop = await rpc("RemoveWatcher", { watcherId });
  const gone = (await rpc("GetWatcherEvents", { watcherId })).error;
  return { created: c && { name: c.name, entry: c.entry?.path }, taken, end, again, stop, gone };
});

await attempt("metadata", async () => {
  const md = { author: "shed", purpose: "test" };
  const written = await sandbox.files.write("/root/md/a.txt", "a", { metadata: md });
  const info = await sandbox.files.getInfo("/root/md/a.txt");
  const listed = (await sandbox.files.list("/root/md")).find((e) => e.name === "a.txt");
  const moved = await sandbox.files.rename("/root/md/a.txt", "/root/md/b.txt");
  const over = await sandbox.files.write("/root/md/b.txt", "again");
  const after = await sandbox.files.getInfo("/root/md/b.txt");
  return { written: written.metadata, info: info.metadata, listed: listed?.metadata, moved: moved.metadata, over: over.metadata ?? null, after: after.metadata ?? null };
});

// SIGTERM reaches the command's process, which may catch it (as envd passes it); SIGKILL ends it.
await attempt("sigterm", async () => {
  let stdout = "";
  const h = await sandbox.commands.run(`sh -c 'trap "echo got-term; exit 7" TERM; echo ready; while :; do sleep 0.1; done'`,
    { background: true, onStdout: (d) => { stdout += d; } });
  await until(() => stdout.includes("ready"));
  const res = await fetch(`${process.env.E2B_SANDBOX_URL}/process.Process/SendSignal`, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Access-Token": sandbox.envdAccessToken, "E2b-Sandbox-Id": sandbox.sandboxId },
    body: JSON.stringify({ process: { pid: h.pid }, signal: "SIGNAL_SIGTERM" }),
  });
  let exit;
  try {
    exit = (await h.wait()).exitCode;
  } catch (e) {
    exit = e.exitCode ?? `${e.name}: ${e.message}`;
  }
  return { status: res.status, exit, caught: stdout.includes("got-term") };
});

await attempt("after", async () => (await sandbox.commands.run("echo alive")).stdout);
await sandbox.kill();
