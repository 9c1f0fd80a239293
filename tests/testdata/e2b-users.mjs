// The accounts of a Bench through the unmodified `e2b` SDK, as E2B's users meet them: a sandbox of a
// Workshop that declares E2B's `user` (home /home/user, passwordless sudo) runs commands as that
// user, resolves relative paths against its home, reports owners by name, and root stays available
// (user: 'root'). One JSON object per step on stdout; a step that throws prints its error instead.
import { Sandbox } from "e2b";

const [template] = process.argv.slice(2);
const out = (step, value) => console.log(JSON.stringify({ step, value }));
const attempt = async (step, fn) => {
  try {
    out(step, { ok: true, value: await fn() });
  } catch (e) {
    out(step, { ok: false, error: `${e.name}: ${e.message}` });
  }
};
const run = async (cmd, opts) => {
  const r = await sandbox.commands.run(cmd, opts);
  return r.stdout.trim();
};
const owner = (e) => ({ path: e.path, owner: e.owner, group: e.group });

const sandbox = await Sandbox.create(template, { timeoutMs: 300_000 });
try {
  await attempt("whoami", () => run("whoami"));
  await attempt("env", () => run('echo "$(pwd) $HOME $USER"'));
  await attempt("sudo", () => run("sudo -n whoami"));
  await attempt("root", () => run('echo "$(whoami) $(pwd) $HOME"', { user: "root" }));
  await attempt("cwd", async () => {
    await sandbox.files.makeDir("work/sub");
    return run("pwd", { cwd: "work/sub" });
  });
  await attempt("write", async () => {
    const w = await sandbox.files.write("notes/a.txt", "relative");
    return { path: w.path, read: await sandbox.files.read("/home/user/notes/a.txt") };
  });
  await attempt("info", async () => [owner(await sandbox.files.getInfo("notes/a.txt")), owner(await sandbox.files.getInfo("notes"))]);
  await attempt("shell-owner", () => run("stat -c '%U:%G' notes/a.txt notes work work/sub"));
  await attempt("list", async () => (await sandbox.files.list(".")).filter((e) => !e.name.startsWith(".")).map(owner));
  await attempt("rename", async () => owner(await sandbox.files.rename("notes/a.txt", "moved/b.txt")));
  await attempt("tilde", () => sandbox.files.read("~/moved/b.txt"));
  await attempt("user-edits", () => run("echo more >> moved/b.txt && cat moved/b.txt"));
  await attempt("root-write", async () => {
    const w = await sandbox.files.write("r.txt", "as root", { user: "root" });
    return { path: w.path, ...owner(await sandbox.files.getInfo("/root/r.txt", { user: "root" })) };
  });
  await attempt("root-file", () => run("stat -c '%U:%G' /root/r.txt", { user: "root" }));
  await attempt("unknown-command", () => run("id", { user: "nosuchuser" }));
  await attempt("unknown-file", () => sandbox.files.write("x.txt", "x", { user: "nosuchuser" }));
  await attempt("unknown-rpc", () => sandbox.files.list(".", { user: "nosuchuser" }));
  await attempt("after", () => run("whoami"));
} finally {
  await sandbox.kill();
}
