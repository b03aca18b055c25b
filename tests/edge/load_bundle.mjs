// Test helper: Bundle.load of runtime/web/edgeseq.mjs on a bundle directory, with fetch
// reading the directory and a stand-in for onnxruntime-web (no graph is run).
//   node tests/edge/load_bundle.mjs BUNDLE_DIR [SEARCH]  ->  {"ok": true} or {"error": "Name: message"}
// (with "externalData": {DATA_FILE: bytes handed to onnxruntime-web} when a graph has some)
// (SEARCH: Bundle.load's search option, "loop" by default; "both" also fetches the search graph)
// Also: node tests/edge/load_bundle.mjs --fingerprint FILE...  -> {"FILE": hex, ...}
//       node tests/edge/load_bundle.mjs --metadata FILE.onnx   -> {key: value, ...}
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Bundle, onnxMetadata, vocabularyFingerprint } from "../../runtime/web/edgeseq.mjs";

const [first, ...rest] = process.argv.slice(2);
if (first === "--fingerprint") {
  const out = {};
  for (const file of rest) out[file] = await vocabularyFingerprint(JSON.parse(readFileSync(file, "utf8")));
  console.log(JSON.stringify(out));
} else if (first === "--metadata") {
  console.log(JSON.stringify(onnxMetadata(new Uint8Array(readFileSync(rest[0])))));
} else {
  const base = "https://bundle.test/";
  globalThis.fetch = async (url) => {
    try {
      const bytes = readFileSync(join(first, url.slice(base.length)));
      return { ok: true, status: 200, arrayBuffer: async () => bytes };
    } catch {
      return { ok: false, status: 404 };
    }
  };
  const externalData = {};
  const create = async (bytes, options) => {
    for (const { path, data } of options.externalData ?? []) externalData[path] = data.length;
    return {};
  };
  const ort = { InferenceSession: { create }, Tensor: class {} };
  try {
    await Bundle.load(ort, base, { search: rest[0] ?? "loop" });
    const seen = Object.keys(externalData).length ? { externalData } : {};
    console.log(JSON.stringify({ ok: true, ...seen }));
  } catch (err) {
    console.log(JSON.stringify({ error: `${err.name}: ${err.message}` }));
  }
}
