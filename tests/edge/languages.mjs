// Test helper: Bundle of runtime/web/edgeseq.mjs on a bundle directory, to check what the
// browser feeds the encoder, forces first (a bundle's languages, a target prefix) and outputs.
//   node tests/edge/languages.mjs BUNDLE_DIR [--variant V] [--ort NODE_MODULES] < cases.json
//     ->  [{encoded, fed, output} | {encoded, output, text} (--ort) | {error}]
// A case: {text, sourceLang?, targetLang?, targetPrefix?, maxNewTokens?, favour?, inGraph?}.
// Without --ort a stand-in for onnxruntime-web whose decoder ranks the case's `favour` id
// first (no graph is run; `fed`: the ids the encoder got); with --ort the real graphs of the
// variant run in onnxruntime-web (wasm) from that node_modules folder, and `text` is
// generate()'s output. `inGraph`: the case runs generateInGraph instead (its refusals).
// Also: node tests/edge/languages.mjs --generation < config.json  ->  generationDefaults(config)
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { Bundle } from "../../runtime/web/edgeseq.mjs";
import { generationDefaults } from "../../runtime/web/languages.mjs";

const input = JSON.parse(readFileSync(0, "utf8"));
if (process.argv[2] === "--generation") {
  console.log(JSON.stringify(generationDefaults(input)));
  process.exit(0);
}
const { values: flags, positionals } = parseArgs({
  allowPositionals: true,
  options: { variant: { type: "string", default: "fp32" }, ort: { type: "string" } },
});
const dir = positionals[0];
const base = "https://bundle.test/";
globalThis.fetch = async (url) => {
  const bytes = readFileSync(join(dir, url.slice(base.length)));
  return { ok: true, status: 200, arrayBuffer: async () => bytes };
};
class Tensor {
  constructor(type, data, dims) {
    Object.assign(this, { type, data, dims });
  }
}
const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
const state = { fed: null, favour: 0 };
const names = (graph, side) => config.io[graph][side].map(({ name }) => name);
const encoder = {
  run: async (feeds) => {
    state.fed = Array.from(Object.values(feeds)[0].data, Number);
    return Object.fromEntries(names("encoder", "outputs").map((n) => [n, new Tensor("float32", [], [])]));
  },
};
const decoder = {
  run: async () => {
    const logits = new Float32Array(config.model.tgt_vocab_size);
    logits[state.favour] = 1;
    const out = Object.fromEntries(names("decoder", "outputs").map((n) => [n, new Tensor("float32", [], [])]));
    out[names("decoder", "outputs").find((n) => n === "logits")] = new Tensor("float32", logits, [1, 1, logits.length]);
    return out;
  },
};
const sessions = [encoder, decoder];
const standIn = { InferenceSession: { create: async () => sessions.shift() }, Tensor };
const ort = flags.ort
  ? await import(pathToFileURL(join(flags.ort, "onnxruntime-web", "dist", "ort.node.min.mjs")))
  : standIn;
if (flags.ort) ort.env.wasm.numThreads = 1;
const bundle = await Bundle.load(ort, base, { variant: flags.variant });
const results = [];
for (const { text, favour, inGraph, ...options } of input) {
  try {
    if (inGraph) {
      await bundle.generateInGraph(text, options);
      throw new Error("generateInGraph ran");
    }
    state.favour = favour;
    state.fed = null;
    const forced = bundle.forcedIds(options);
    const encoded = bundle.encode(text, { sourceLang: options.sourceLang });
    const { maxNewTokens } = options;
    const output = encoded ? await bundle.greedyIds(encoded, { forced, maxNewTokens }) : [];
    const generated = await bundle.generate(text, options); // the public path (same refusals)
    const { fed } = state;
    results.push(flags.ort ? { encoded, output, text: generated } : { encoded, fed, output });
  } catch (err) {
    results.push({ error: `${err.name}: ${err.message}` });
  }
}
console.log(JSON.stringify(results));
