// The benchmark of an E2B harness against shed, as ComputeSDK measures hosted providers
// (github.com/computesdk/benchmarks): the unmodified `e2b` package, pointed at shed by E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY. Usage: e2b-bench.mjs TEMPLATE MODE N
//
//   sequential  N sandboxes one after another, each created, run and killed before the next
//   staggered   N sandboxes, the create of each started 200 ms after the one before
//   burst       N sandboxes, every create started at once
//   actions     one sandbox, N commands.run("true") one after another (after 5 not counted)
//   create      N sandboxes one after another, the time of Sandbox.create alone (after 2 not counted)
//
// A sandbox's time is from the create call to the output of its first command (ComputeSDK's "time to
// interactive"); a kill is not counted. It prints one JSON object: {"mode", "ms": [...], "errors": [...]}.
import { Sandbox } from "e2b";
// The SDK imports undici at a process's first request (150-270 ms of this machine's time, the client's
// own): imported before any clock starts, as in a harness past its first request. ComputeSDK runs each
// mode in one process, so only its first sandbox pays it (and its trimming drops that one).
await import("undici");

const [template, mode, count] = process.argv.slice(2);
const n = Number(count);
const ms = [];
const errors = [];

// tti is one sandbox's time to interactive: create, then the first command, whose output is checked.
async function tti() {
  const start = performance.now();
  let sandbox;
  try {
    sandbox = await Sandbox.create(template, { timeoutMs: 300_000 });
    const r = await sandbox.commands.run("echo benchmark");
    if (r.stdout !== "benchmark\n") throw new Error(`first command said ${JSON.stringify(r.stdout)}`);
    ms.push(performance.now() - start);
  } catch (e) {
    errors.push(`${e.name}: ${e.message}`);
  } finally {
    if (sandbox) await sandbox.kill().catch((e) => errors.push(`kill: ${e.message}`));
  }
}

const sleep = (t) => new Promise((resolve) => setTimeout(resolve, t));

switch (mode) {
  case "sequential":
    for (let i = 0; i < n; i++) await tti();
    break;
  case "staggered": {
    const all = [];
    for (let i = 0; i < n; i++) {
      all.push(tti());
      if (i < n - 1) await sleep(200);
    }
    await Promise.all(all);
    break;
  }
  case "burst":
    await Promise.all(Array.from({ length: n }, () => tti()));
    break;
  case "actions": {
    const sandbox = await Sandbox.create(template, { timeoutMs: 300_000 });
    try {
      for (let i = 0; i < 5 + n; i++) {
        const start = performance.now();
        const r = await sandbox.commands.run("true");
        if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
        if (i >= 5) ms.push(performance.now() - start);
      }
    } catch (e) {
      errors.push(`${e.name}: ${e.message}`);
    } finally {
      await sandbox.kill();
    }
    break;
  }
  case "create":
    for (let i = 0; i < 2 + n; i++) {
      const start = performance.now();
      let sandbox;
      try {
        sandbox = await Sandbox.create(template, { timeoutMs: 300_000 });
        if (i >= 2) ms.push(performance.now() - start);
      } catch (e) {
        errors.push(`${e.name}: ${e.message}`);
      } finally {
        if (sandbox) await sandbox.kill().catch((e) => errors.push(`kill: ${e.message}`));
      }
    }
    break;
  default:
    throw new Error(`mode ${mode}: sequential, staggered, burst, actions or create`);
}
console.log(JSON.stringify({ mode, ms, errors }));
