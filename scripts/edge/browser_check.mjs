// Run runtime/web/ in Debian's headless Chromium and write its outputs for a words file.
//
//   node scripts/edge/browser_check.mjs --bundle bundles/g2p-en --words words.txt \
//     --out OUT_DIR [--variant fp32] [--screenshot docs/edge-demo.png] [--word quokka]
//
// Serves runtime/web/ at http://127.0.0.1:PORT/ with onnxruntime-web's dist/ as ort/ and the
// bundle as bundle/ (the layout index.html expects), opens index.html?variant=V in
// chromium-headless-shell (or chromium) through puppeteer-core, generates every line of the
// words file in the page with the page's own Bundle, writes OUT_DIR/browser-V.txt (one output
// line per input line) and OUT_DIR/browser-V.seconds, and optionally types --word into the
// page and saves a screenshot. Node modules come from $EDGESEQ_NODE_MODULES (make edge
// installs scripts/edge/package.json there); the browser from $CHROMIUM or the usual paths.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createReadStream, statSync } from "node:fs";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const { values: args } = parseArgs({
  options: {
    bundle: { type: "string" },
    words: { type: "string" },
    out: { type: "string" },
    variant: { type: "string", default: "fp32" },
    screenshot: { type: "string" },
    word: { type: "string", default: "quokka" },
  },
});
for (const name of ["bundle", "words", "out"]) {
  if (!args[name]) fail(`--${name} is required (see the comment at the top of this file)`);
}

function fail(message) {
  console.error(`error: ${message}`);
  process.exit(2);
}

const cache = process.env.EDGESEQ_EDGE_CACHE ?? `${repo}/.edge-cache`;
const modules = path.resolve(process.env.EDGESEQ_NODE_MODULES ?? `${cache}/npm/node_modules`);
const require = createRequire(path.join(modules, "noop.js"));
let puppeteer;
try {
  puppeteer = require("puppeteer-core");
} catch {
  fail(`puppeteer-core is not installed in ${modules}; run make edge (it runs npm install)`);
}
const ortDist = path.join(modules, "onnxruntime-web", "dist");
if (!existsSync(ortDist)) fail(`onnxruntime-web is not installed in ${modules}; run make edge`);
const browserPath = [
  process.env.CHROMIUM,
  "/usr/bin/chromium-headless-shell",
  "/usr/bin/chromium",
  "/usr/bin/chromium-browser",
].find((p) => p && existsSync(p));
if (!browserPath) fail("no Chromium found; apt-get install -y chromium-headless-shell (or set CHROMIUM)");

const roots = [
  ["/ort/", ortDist],
  ["/bundle/", path.resolve(args.bundle)],
  ["/", path.join(repo, "runtime", "web")],
];
const types = { ".html": "text/html", ".mjs": "text/javascript", ".js": "text/javascript",
  ".wasm": "application/wasm", ".json": "application/json", ".onnx": "application/octet-stream" };

const server = createServer((req, res) => {
  const urlPath = decodeURIComponent(new URL(req.url, "http://x").pathname);
  const [prefix, dir] = roots.find(([p]) => urlPath.startsWith(p));
  const file = path.resolve(dir, `.${urlPath.slice(prefix.length - 1)}`);
  if (!file.startsWith(dir + path.sep) || !existsSync(file) || !statSync(file).isFile()) {
    res.writeHead(404).end("not found");
    return;
  }
  res.writeHead(200, { "Content-Type": types[path.extname(file)] ?? "application/octet-stream" });
  createReadStream(file).pipe(res);
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const base = `http://127.0.0.1:${server.address().port}`;

const lines = readFileSync(args.words, "utf8").split("\n");
if (lines.at(-1) === "") lines.pop();
const browser = await puppeteer.launch({
  executablePath: browserPath,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu"],
});
let exitCode = 0;
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 720, height: 360 });
  page.on("pageerror", (err) => console.error(`page error: ${err.message}`));
  await page.goto(`${base}/index.html?variant=${encodeURIComponent(args.variant)}`);
  await page.waitForFunction("window.edgeseq !== undefined", { timeout: 120_000 });
  const loadError = await page.evaluate("window.edgeseq.error ?? null");
  if (loadError) throw new Error(`the page could not load the bundle: ${loadError}`);
  const started = Date.now();
  const outputs = await page.evaluate(async (texts) => {
    const out = [];
    for (const text of texts) {
      try {
        out.push(await window.edgeseq.bundle.generate(text));
      } catch (err) {
        out.push(`error: ${err.message}`);
      }
    }
    return out;
  }, lines);
  const seconds = (Date.now() - started) / 1000;
  mkdirSync(args.out, { recursive: true });
  writeFileSync(path.join(args.out, `browser-${args.variant}.txt`), outputs.map((o) => `${o}\n`).join(""));
  writeFileSync(path.join(args.out, `browser-${args.variant}.seconds`), `${seconds.toFixed(1)}\n`);
  if (args.screenshot) {
    await page.type("#word", args.word);
    await page.waitForFunction("document.getElementById('output').textContent.length > 0");
    await page.screenshot({ path: args.screenshot });
  }
  console.log(JSON.stringify({ variant: args.variant, inputs: lines.length, seconds, browser: await browser.version() }));
} catch (err) {
  console.error(`error: ${err.message}`);
  exitCode = 1;
} finally {
  await browser.close();
  server.close();
}
process.exit(exitCode);
