// Fossil delta interop with the `fossil-delta` package (the one Centrifugo's JS SDK decodes
// with): for each case N in the directory given, applies freeboard's delta (N.rust) to N.source
// and checks that it makes N.target, then writes the package's own delta as N.node for
// freeboard to apply. Exits 1 naming the first case that differs.
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { applyDelta, createDelta } from "fossil-delta";

const dir = process.argv[2];
const cases = readdirSync(dir).filter((f) => f.endsWith(".source")).map((f) => f.slice(0, -7));
for (const name of cases) {
  const read = (ext) => new Uint8Array(readFileSync(join(dir, `${name}.${ext}`)));
  const [source, target, rust] = [read("source"), read("target"), read("rust")];
  const applied = applyDelta(source, rust);
  if (Buffer.compare(Buffer.from(applied), Buffer.from(target)) !== 0) {
    console.error(`case ${name}: freeboard's delta applied by fossil-delta differs from the target`);
    process.exit(1);
  }
  writeFileSync(join(dir, `${name}.node`), createDelta(source, target));
}
console.log(`${cases.length} cases`);
