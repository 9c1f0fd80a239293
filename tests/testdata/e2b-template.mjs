// An evaluation harness's first steps, as mini-swe-agent's E2B environment takes them: Template.exists,
// then a build from the task's image, then Sandbox.create of the template and a command; the
// unmodified `e2b` package, pointed at shed by E2B_API_URL and E2B_SANDBOX_URL. The operator's key
// (E2B_API_KEY) records; USER_KEY's builds become proposals. One JSON object per step on stdout.
import { Sandbox, Template } from "e2b";

const [image, name] = process.argv.slice(2);
const userKey = process.env.USER_KEY;
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
const logs = [];
const onBuildLogs = (l) => logs.push(l.message ?? String(l));

await attempt("exists-before", () => Template.exists(name));
await attempt("build", async () => {
  const t = Template().fromImage(image).aptInstall(["jq"]).setEnvs({ TASK: "one" }).setWorkdir("/testbed");
  const info = await Template.build(t, `${name}:v1`, { onBuildLogs });
  return { name: info.name, tags: info.tags, logged: logs.some((m) => m.includes("recorded")) };
});
await attempt("exists-after", () => Template.exists(name));
await attempt("run", async () => {
  const sandbox = await Sandbox.create(name, { timeoutMs: 300_000 });
  try {
    const r = await sandbox.commands.run("cat /etc/task-id; pwd; echo $TASK; jq -n 1+1");
    return { exitCode: r.exitCode, stdout: r.stdout };
  } finally {
    await sandbox.kill();
  }
});
await attempt("by-tag", async () => {
  const sandbox = await Sandbox.create(`${name}:v1`, { timeoutMs: 60_000 });
  await sandbox.kill();
  return sandbox.sandboxId.length > 0;
});
await attempt("tags", async () => (await Template.getTags(name)).map((t) => t.tag).sort());
await attempt("assign", async () => (await Template.assignTags(`${name}:v1`, ["stable"])).tags);
await attempt("not-declarative", async () => Template.build(Template().fromImage(image).runCmd("make install"), `${name}-make`));
await attempt("copy", async () => Template.build(Template({ fileContextPath: "/etc" }).fromImage(image).copy("hostname", "/x"), `${name}-copy`));
await attempt("user-build", async () =>
  Template.build(Template().fromTemplate(name).aptInstall(["tree"]), `${name}-user`, { apiKey: userKey }));
await attempt("user-exists", () => Template.exists(`${name}-user`, { apiKey: userKey }));
await attempt("user-delete", async () => Sandbox.deleteSnapshot(name, { apiKey: userKey }));
await attempt("delete", async () => Sandbox.deleteSnapshot(name));
await attempt("exists-deleted", () => Template.exists(name));
