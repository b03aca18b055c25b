// Run runtime/web/ in Debian's headless Chromium and write its outputs for a words file.
//
//   node scripts/edge/browser_check.mjs --bundle bundles/g2p-en --words words.txt \
//     --out OUT_DIR [--variant fp32] [--search loop|graph] [--beams N] [--batch-size N]
//     [--screenshot docs/edge-demo.png] [--word quokka] [--source-lang C] [--target-lang C]
//
// Serves runtime/web/ at http://127.0.0.1:PORT/ with onnxruntime-web's dist/ as ort/ and the
// bundle as bundle/ (the layout index.html expects), opens index.html?variant=V in
// chromium-headless-shell (or chromium) through puppeteer-core, generates every line of the
// words file in the page with the page's own Bundle, writes OUT_DIR/browser-V.txt (one output
// line per input line) and OUT_DIR/browser-V.seconds, and optionally types --word into the
// page and saves a screenshot. With --search graph the page loads the variant's one-graph
// search file instead and runs bundle.generateInGraph(lines, {beams, batchSize}), batched as
// `edgeseq generate --batch-size N` batches (default 32); the files are then
// OUT_DIR/browser-search-V.txt and .seconds. --source-lang / --target-lang: a bundle with a
// language list runs generate(text, {sourceLang, targetLang}) (its defaults when absent; the
// search graph forces no target language). Exit status: 0 done, 1 failed, 2 bad arguments
// or missing tools, 3 onnxruntime-web cannot load the graph (the message says why, e.g. an
// operator its wasm build lacks). Node modules come from $EDGESEQ_NODE_MODULES, else
// $EDGESEQ_EDGE_CACHE/npm/node_modules (default .edge-cache; make edge installs
// scripts/edge/package.json there); the browser from $CHROMIUM or the usual paths.
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
    search: { type: "string", default: "loop" },
    beams: { type: "string", default: "1" },
    "batch-size": { type: "string", default: "32" },
    "source-lang": { type: "string" },
    "target-lang": { type: "string" },
  },
});
if (!["loop", "graph"].includes(args.search)) fail(`--search is ${args.search}; use loop or graph`);
const beams = Number.parseInt(args.beams, 10);
if (!(beams >= 1)) fail(`--beams is ${args.beams}; use a positive integer`);
const batchSize = Number.parseInt(args["batch-size"], 10);
if (!(batchSize >= 1)) fail(`--batch-size is ${args["batch-size"]}; use a positive integer`);
const label = args.search === "graph" ? `search-${args.variant}` : args.variant;
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
  const query = new URLSearchParams({ variant: args.variant, search: args.search, beams });
  await page.goto(`${base}/index.html?${query}`);
  await page.waitForFunction("window.edgeseq !== undefined", { timeout: 120_000 });
  const loadError = await page.evaluate("window.edgeseq.error ?? null");
  if (loadError) {
    if (loadError.startsWith("onnxruntime-web cannot load")) exitCode = 3;
    throw new Error(`the page could not load the bundle: ${loadError}`);
  }
  const started = Date.now();
  const outputs = await page.evaluate(
    async (texts, inGraph, options, languages) => {
      const { bundle } = window.edgeseq;
      if (inGraph) {
        try {
          return await bundle.generateInGraph(texts, { ...options, ...languages });
        } catch (err) {
          return texts.map(() => `error: ${err.message}`);
        }
      }
      const out = [];
      for (const text of texts) {
        try {
          out.push(await bundle.generate(text, languages));
        } catch (err) {
          out.push(`error: ${err.message}`);
        }
      }
      return out;
    },
    lines,
    args.search === "graph",
    { beams, batchSize },
    { sourceLang: args["source-lang"], targetLang: args["target-lang"] },
  );
  const seconds = (Date.now() - started) / 1000;
  mkdirSync(args.out, { recursive: true });
  writeFileSync(path.join(args.out, `browser-${label}.txt`), outputs.map((o) => `${o}\n`).join(""));
  writeFileSync(path.join(args.out, `browser-${label}.seconds`), `${seconds.toFixed(1)}\n`);
  if (args.screenshot) {
    await page.type("#word", args.word);
    await page.waitForFunction("document.getElementById('output').textContent.length > 0");
    await page.screenshot({ path: args.screenshot });
  }
  const ortVersion = JSON.parse(readFileSync(path.join(ortDist, "..", "package.json"), "utf8")).version;
  console.log(JSON.stringify({ variant: label, beams, inputs: lines.length, seconds,
    browser: await browser.version(), onnxruntimeWeb: ortVersion }));
} catch (err) {
  console.error(`error: ${err.message}`);
  exitCode ||= 1;
} finally {
  await browser.close();
  server.close();
}
process.exit(exitCode);
