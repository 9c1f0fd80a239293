// The sandboxes' ports as E2B's SDK users reach them: sandbox.getHost(port) is PORT-ID.DOMAIN, on the
// address of E2B_API_URL; plain HTTP, a WebSocket (the `ws` package: node 20 has no client), a port
// nothing listens on, bad port hosts, a sandbox made with allowPublicTraffic false (its traffic token,
// maskRequestHost), signed file URLs (downloadUrl, uploadUrl), and a killed sandbox's host. One JSON
// object per step on stdout, as e2b-client.mjs prints them. (This SDK sends no `secure` at create:
// e2b/secure_test.go tests secure false.)
import { Sandbox } from "e2b";
import WebSocket from "ws";
import http from "node:http";
import fs from "node:fs";
import readline from "node:readline";

const [template, serverPath] = process.argv.slice(2);
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
// DOMAIN is localhost:PORT: browsers and curl take every *.localhost name for loopback (RFC 6761);
// node asks the system's resolver, which need not, so this lookup says it.
const loopback = (host, opts, cb) => {
  if (!host.endsWith(".localhost")) return cb(new Error(`not a *.localhost name: ${host}`));
  return opts && opts.all ? cb(null, [{ address: "127.0.0.1", family: 4 }]) : cb(null, "127.0.0.1", 4);
};
const get = (url, headers = {}, method = "GET") =>
  new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers, lookup: loopback }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode, type: res.headers["content-type"], body }));
    });
    req.on("error", reject);
    req.end();
  });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const start = async (sbx) => {
  await sbx.files.write("/tmp/portserver", fs.readFileSync(serverPath).buffer);
  await sbx.commands.run("chmod +x /tmp/portserver");
  await sbx.commands.run("/tmp/portserver 8000", { background: true });
};
const until200 = async (url, headers) => {
  let r;
  for (let i = 0; i < 100; i++) {
    r = await get(url, headers);
    if (r.status === 200) return r;
    await sleep(100);
  }
  return r;
};

let a, b;
await attempt("create", async () => {
  a = await Sandbox.create(template, { timeoutMs: 600_000 });
  b = await Sandbox.create(template, {
    timeoutMs: 600_000,
    network: { allowPublicTraffic: false, maskRequestHost: "${PORT}-masked.example" },
  });
  return { a: a.sandboxId, host: a.getHost(8000), aSecure: !!a.envdAccessToken, bTraffic: !!b.trafficAccessToken };
});
if (!a || !b) process.exit(0);
await attempt("start", async () => { await start(a); await start(b); return true; });
await attempt("http", async () => (await until200(`http://${a.getHost(8000)}/some/path?q=1`)).body);
await attempt("ws", async () => {
  const ws = new WebSocket(`ws://${a.getHost(8000)}/socket`, { lookup: loopback });
  const got = await new Promise((resolve, reject) => {
    ws.on("open", () => ws.send("hello over ws"));
    ws.on("message", (m) => resolve(m.toString()));
    ws.on("error", reject);
  });
  ws.close();
  return got;
});
await attempt("closed", async () => get(`http://${a.getHost(8001)}/`));
await attempt("bad-ports", async () => {
  const dom = a.getHost(8000).replace(/^8000-[^.]*\./, "");
  const res = [];
  for (const p of ["0", "65536", "x"]) res.push((await get(`http://${p}-${a.sandboxId}.${dom}/`)).status);
  return res;
});
await attempt("private-none", async () => (await get(`http://${b.getHost(8000)}/`)).status);
await attempt("private-wrong", async () => (await get(`http://${b.getHost(8000)}/`, { "e2b-traffic-access-token": "not-it" })).status);
await attempt("private-token", async () => (await until200(`http://${b.getHost(8000)}/`, { "e2b-traffic-access-token": b.trafficAccessToken })).body);

// Signed URLs of the secure sandbox: plain fetches, no token in any header.
await a.files.write("/root/s.txt", "signed content");
await attempt("signed", async () => {
  const r = await fetch(await a.downloadUrl("/root/s.txt", { user: "root", useSignatureExpiration: 60 }));
  return { status: r.status, body: await r.text() };
});
await attempt("signed-forever", async () => (await fetch(await a.downloadUrl("/root/s.txt", { user: "root" }))).status);
await attempt("signed-expired", async () => {
  const r = await fetch(await a.downloadUrl("/root/s.txt", { user: "root", useSignatureExpiration: -10 }));
  return { status: r.status, body: await r.json() };
});
await attempt("signed-wrong", async () => {
  const u = new URL(await a.downloadUrl("/root/s.txt", { user: "root", useSignatureExpiration: 60 }));
  u.searchParams.set("path", "/etc/shadow"); // the signature is of another path
  const r = await fetch(u);
  return { status: r.status, body: await r.json() };
});
await attempt("signed-upload", async () => {
  const form = new FormData();
  form.append("file", new Blob(["uploaded content"]), "up.txt");
  const r = await fetch(await a.uploadUrl("/root/up.txt", { user: "root", useSignatureExpiration: 60 }), { method: "POST", body: form });
  return { status: r.status, body: await r.json(), back: await a.files.read("/root/up.txt") };
});
await attempt("signed-read-as-write", async () => {
  const form = new FormData();
  form.append("file", new Blob(["not written"]), "s.txt");
  const r = await fetch(await a.downloadUrl("/root/s.txt", { user: "root" }), { method: "POST", body: form });
  return { status: r.status, back: await a.files.read("/root/s.txt") };
});

// The Go test tries a's port as another local user here, then says go.
out("hold", { host: a.getHost(8000) });
const rl = readline.createInterface({ input: process.stdin });
for await (const line of rl) if (line === "go") break;
await attempt("after-others", async () => (await get(`http://${a.getHost(8000)}/again`)).body);
await attempt("killed", async () => {
  const host = a.getHost(8000);
  await a.kill();
  const r = await get(`http://${host}/`);
  return { status: r.status, body: JSON.parse(r.body) };
});
await b.kill();
