// A SWE-bench-shaped harness's setup: one template per task image, built from the image as
// mini-swe-agent does (Template.build(Template().fromImage(image), name)), through the unmodified
// `e2b` package. Arguments: pairs of IMAGE NAME. Prints one JSON line per build.
import { Template } from "e2b";

const args = process.argv.slice(2);
for (let i = 0; i < args.length; i += 2) {
  const [image, name] = [args[i], args[i + 1]];
  const start = Date.now();
  try {
    await Template.build(Template().fromImage(image), name);
    console.log(JSON.stringify({ name, ok: true, ms: Date.now() - start }));
  } catch (e) {
    console.log(JSON.stringify({ name, ok: false, error: `${e.name}: ${e.message}` }));
    process.exit(1);
  }
}
