// Test helper: Bundle of runtime/web/edgeseq.mjs on a bundle directory with a stand-in for
// onnxruntime-web whose decoder always ranks one id first (no graph is run), to check what
// the browser feeds the encoder and forces first for a bundle's languages.
//   node tests/edge/languages.mjs BUNDLE_DIR < cases.json  ->  [{encoded, fed, output} | {error}]
// A case: {text, sourceLang?, targetLang?, maxNewTokens?, favour: id the decoder ranks first}.
// Also: node tests/edge/languages.mjs --generation < config.json  ->  generationDefaults(config)
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Bundle } from "../../runtime/web/edgeseq.mjs";
import { generationDefaults } from "../../runtime/web/languages.mjs";

const input = JSON.parse(readFileSync(0, "utf8"));
if (process.argv[2] === "--generation") {
  console.log(JSON.stringify(generationDefaults(input)));
  process.exit(0);
}
const dir = process.argv[2];
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
const ort = { InferenceSession: { create: async () => sessions.shift() }, Tensor };
const bundle = await Bundle.load(ort, base);
const results = [];
for (const { text, favour, ...options } of input) {
  try {
    state.favour = favour;
    state.fed = null;
    const encoded = bundle.encode(text, { sourceLang: options.sourceLang });
    const output = await bundle.greedyIds(encoded, {
      forced: bundle.prefixes(options).target,
      ...(options.maxNewTokens ? { maxNewTokens: options.maxNewTokens } : {}),
    });
    await bundle.generate(text, options); // the public path runs too (and refuses the same)
    results.push({ encoded, fed: state.fed, output });
  } catch (err) {
    results.push({ error: `${err.name}: ${err.message}` });
  }
}
console.log(JSON.stringify(results));
