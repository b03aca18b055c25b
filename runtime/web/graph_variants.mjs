// The browser's checks of the extra graphs a bundle may hold besides its encoder and decoder.
// Which variants exist, and in which precisions, is runtime/graph_variants.py's registry,
// written to graph_variants_table.mjs by scripts/graph_variants_mjs.py.
//
//   graphVariantProblem(manifest)   // null, or what is wrong with an entry (one sentence)
//
// Bundle.load checks every entry of every variant, as load_bundle does in Python: an object,
// each precision naming a file inside the bundle that manifest.json lists. Graph bytes are
// checked (sha256, vocabulary fingerprint) for the files the page fetches, which are only the
// search graph's: the step-batching and in-place decoders serve Python's runtime.

import { GRAPH_VARIANTS } from "./graph_variants_table.mjs";

/** Whether `name` is a relative path that stays inside the bundle directory. */
function inside(name) {
  return (
    typeof name === "string" &&
    name.length > 0 &&
    !name.startsWith("/") &&
    !/^[A-Za-z]:/.test(name) &&
    !name.split(/[\\/]/).includes("..")
  );
}

/** The first problem of the manifest's graph-variant entries, or null when there is none. */
export function graphVariantProblem(manifest) {
  for (const [key, precisions] of Object.entries(GRAPH_VARIANTS)) {
    const entry = manifest[key];
    if (entry === undefined || entry === null) continue;
    if (typeof entry !== "object" || Array.isArray(entry)) {
      return `manifest.json: "${key}" is not a JSON object; re-export the bundle`;
    }
    for (const precision of precisions) {
      if (!(precision in entry)) continue;
      const name = entry[precision]?.file;
      if (typeof name !== "string") {
        return `manifest.json: "${key}" lists ${precision} without naming its graph file; re-export the bundle`;
      }
      if (!inside(name)) {
        return `manifest.json names '${name}', which is outside the bundle directory; re-export it or copy it whole`;
      }
      if (!manifest.files?.[name]) {
        return `${name} is not listed in manifest.json, so its checksum cannot be verified; re-export the bundle`;
      }
    }
  }
  return null;
}
