// An agent harness as the E2B SDK's users write one: the unmodified `e2b` package, pointed at shed by
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. It prints one JSON object per step on stdout, for the
// Go test to check; a step that throws prints its error instead.
import { Sandbox } from "e2b";

const [template, pkg, hold] = process.argv.slice(2);
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
const result = (r) => ({ exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr });

let sandbox;
await attempt("create", async () => {
  sandbox = await Sandbox.create(template, { timeoutMs: 600_000, envs: { GREETING: "hi" }, metadata: { purpose: "test" } });
  // The token is printed for the test's search of the store and logs for secrets, never kept.
  return { id: sandbox.sandboxId, token: sandbox.envdAccessToken };
});
if (!sandbox) process.exit(0);
await attempt("list", async () => (await Sandbox.list().nextItems()).map((s) => ({ id: s.sandboxId, template: s.templateId, metadata: s.metadata })));
await attempt("info", async () => {
  const i = await sandbox.getInfo();
  return { id: i.sandboxId, template: i.templateId, state: i.state, end: i.endAt.getTime() - Date.now() };
});
await attempt("install", async () => result(await sandbox.commands.run(
  `apt-get -qq update >/dev/null && apt-get -qq install -y --no-install-recommends ${pkg} >/dev/null && echo installed`,
  { timeoutMs: 300_000 })));
await attempt("write", async () => sandbox.files.write("/root/work/run.sh", `${pkg} > /root/work/out.txt\necho "ran in $PWD with $GREETING and $EXTRA"\n`));
await attempt("run", async () => result(await sandbox.commands.run("sh run.sh", { cwd: "/root/work", envs: { EXTRA: "more" } })));
await attempt("read", async () => sandbox.files.read("/root/work/out.txt"));
await attempt("relative", async () => { await sandbox.files.write("notes/a.txt", "relative"); return sandbox.files.read("/root/notes/a.txt"); });
await attempt("bytes", async () => {
  const data = new Uint8Array(256).map((_, i) => i);
  await sandbox.files.write("/root/bin.dat", data.buffer);
  const back = await sandbox.files.read("/root/bin.dat", { format: "bytes" });
  return Buffer.from(back).equals(Buffer.from(data));
});
await attempt("many", async () => {
  await sandbox.files.write([{ path: "/root/m/a.txt", data: "A" }, { path: "/root/n/a.txt", data: "B" }]);
  return [await sandbox.files.read("/root/m/a.txt"), await sandbox.files.read("/root/n/a.txt")];
});
await attempt("fast", async () => {
  // Commands that end at once: their output must not be lost to the start of the stream.
  const outs = [];
  for (let i = 0; i < 20; i++) outs.push((await sandbox.commands.run(`echo fast ${i}`)).stdout);
  return outs.every((o, i) => o === `fast ${i}\n`);
});
await attempt("ls", async () => (await sandbox.files.list("/root/work")).map((e) => ({ name: e.name, type: e.type, path: e.path, size: e.size })));
await attempt("mkdir", async () => [await sandbox.files.makeDir("/root/made/deep"), await sandbox.files.makeDir("/root/made/deep")]);
await attempt("exists", async () => [await sandbox.files.exists("/root/made/deep"), await sandbox.files.exists("/root/nothing")]);
await attempt("remove", async () => { await sandbox.files.remove("/root/made"); return sandbox.files.exists("/root/made"); });
await attempt("missing-file", async () => sandbox.files.read("/root/no-such-file"));
await attempt("exit-code", async () => sandbox.commands.run("echo out; echo err >&2; exit 3"));
await attempt("streamed", async () => {
  const chunks = [];
  const r = await sandbox.commands.run("for i in 1 2 3; do echo line $i; sleep 0.2; done", { onStdout: (d) => chunks.push(d) });
  return { chunks: chunks.length, stdout: r.stdout };
});
await attempt("background-kill", async () => {
  const h = await sandbox.commands.run("sleep 600", { background: true });
  const listed = (await sandbox.commands.list()).map((p) => p.pid);
  const killed = await sandbox.commands.kill(h.pid);
  let ended;
  try { await h.wait(); ended = "exited"; } catch (e) { ended = e.name; }
  return { listed: listed.includes(h.pid), killed, ended };
});
await attempt("reconnect-command", async () => {
  const h = await sandbox.commands.run("sleep 1; echo late", { background: true });
  const again = await sandbox.commands.connect(h.pid);
  return result(await again.wait());
});
await attempt("rename", async () => {
  await sandbox.files.write("/root/old.txt", "moved");
  const info = await sandbox.files.rename("/root/old.txt", "/root/new/place.txt");
  return { path: info.path, content: await sandbox.files.read("/root/new/place.txt"), old: await sandbox.files.exists("/root/old.txt") };
});
await attempt("stat", async () => {
  const i = await sandbox.files.getInfo("/root/work/run.sh");
  return { name: i.name, type: i.type, size: i.size, permissions: i.permissions, owner: i.owner };
});
await attempt("connect", async () => {
  const again = await Sandbox.connect(sandbox.sandboxId);
  return (await again.commands.run("echo again")).stdout;
});
await attempt("stdin", async () => {
  const h = await sandbox.commands.run("read line; echo got $line", { background: true, stdin: true });
  await sandbox.commands.sendStdin(h.pid, "hello\n");
  return result(await h.wait());
});
// The agent proposes from inside, as any agent in a Bench does: a POST to its propose socket (perl is
// Essential in Debian; the jq Workshop has no curl or python).
await attempt("propose", async () => result(await sandbox.commands.run(
  `perl -MIO::Socket::UNIX -e '$s = IO::Socket::UNIX->new(Peer => "/run/shed/propose.sock") or die "connect: $!"; ` +
  `print $s "POST /propose HTTP/1.0\\r\\nContent-Length: 0\\r\\n\\r\\n"; print while <$s>'`, { timeoutMs: 300_000 })));
if (hold === "hold") {
  // The test looks for the key and the token in the running Bench, the store and the logs now.
  out("hold", sandbox.sandboxId);
  await new Promise((r) => process.stdin.once("data", r));
  process.stdin.destroy();
}
await attempt("timeout", async () => sandbox.setTimeout(120_000));
await attempt("info-after-timeout", async () => (await sandbox.getInfo()).endAt.getTime() - Date.now());
await attempt("kill", async () => sandbox.kill());
// Other tests' supervisors share the store and the user, so only this sandbox's absence is checked.
await attempt("list-after", async () => (await Sandbox.list().nextItems()).map((s) => s.sandboxId).includes(sandbox.sandboxId));
await attempt("run-after-kill", async () => sandbox.commands.run("true"));
await attempt("no-template", async () => Sandbox.create("no-such-template"));
await attempt("bad-key", async () => Sandbox.create(template, { apiKey: "e2b_" + "0".repeat(40) }));
const short = await attempt("short", async () => (await Sandbox.create(template, { timeoutMs: 2_000 })).sandboxId);
await new Promise((r) => setTimeout(r, 5000));
await attempt("short-after", async () => (await Sandbox.list().nextItems()).map((s) => s.sandboxId).includes(short));
