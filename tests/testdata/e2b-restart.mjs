// A harness whose supervisor dies while its sandbox is paused: `before` makes a sandbox, writes a
// file, starts a counting process and pauses it; `after` (a new supervisor, the same store) connects
// to it by id, which resumes it: the file is there, the counter is not (its processes died with the
// supervisor), and it runs commands. One JSON object per step on stdout, as e2b-branch.mjs.
import { Sandbox } from "e2b";

const [mode, arg] = process.argv.slice(2);
const out = (step, value) => console.log(JSON.stringify({ step, value }));
const attempt = async (step, fn) => {
  try {
    out(step, { ok: true, value: await fn() });
  } catch (e) {
    out(step, { ok: false, error: `${e.name}: ${e.message}` });
  }
};
const wait = (ms) => new Promise((r) => setTimeout(r, ms));

if (mode === "before") {
  await attempt("before", async () => {
    const sbx = await Sandbox.create(arg, { timeoutMs: 600_000 });
    await sbx.files.write("/opt/kept.txt", "written before the crash");
    await sbx.commands.run("i=0; while :; do i=$((i+1)); echo $i > /opt/count; sleep 0.1; done", { background: true });
    await wait(500);
    return { id: sbx.sandboxId, paused: await sbx.pause() };
  });
} else {
  await attempt("after", async () => {
    const sbx = await Sandbox.connect(arg, { timeoutMs: 600_000 });
    const kept = await sbx.files.read("/opt/kept.txt");
    const c1 = (await sbx.files.read("/opt/count")).trim();
    await wait(500);
    const c2 = (await sbx.files.read("/opt/count")).trim();
    const run = (await sbx.commands.run("echo alive")).stdout;
    const running = await sbx.isRunning();
    await sbx.kill();
    return { kept, counted: c1 !== c2, run, running };
  });
}
