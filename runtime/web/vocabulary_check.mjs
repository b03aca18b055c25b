// The vocabulary checks of the browser runtime: a graph's metadata_props read from its bytes,
// and a tokenizer file refused when its fingerprint differs from the one the manifest or the
// graphs record (runtime/vocabulary.py).

import { vocabularyFingerprint } from "./tokenizer.mjs";

/** Every bundle problem the browser runtime reports (edgeseq.mjs re-exports it). */
export class BundleError extends Error {
  constructor(message) {
    super(message);
    this.name = "BundleError";
  }
}

/** metadata_props {key: value} of an .onnx file's bytes: the top level of its protobuf
 * (ModelProto field 14, StringStringEntryProto key 1 / value 2), the graph skipped. */
export function onnxMetadata(bytes) {
  let at = 0;
  const varint = (end) => {
    let value = 0;
    for (let shift = 0; shift < 64; shift += 7) {
      if (at >= end) break;
      const byte = bytes[at++];
      value += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) return value;
    }
    throw new BundleError("a graph file is not an ONNX model; re-export the bundle");
  };
  const utf8 = new TextDecoder("utf-8", { fatal: true });
  const out = {};
  while (at < bytes.length) {
    const tag = varint(bytes.length);
    const wire = tag % 8;
    if (wire === 0) varint(bytes.length);
    else if (wire === 1 || wire === 5) at += wire === 1 ? 8 : 4;
    else if (wire === 2) {
      const length = varint(bytes.length);
      const end = at + length;
      if (Math.floor(tag / 8) === 14) {
        const entry = {};
        while (at < end) {
          const field = Math.floor(varint(end) / 8);
          const size = varint(end);
          entry[field] = utf8.decode(bytes.subarray(at, at + size));
          at += size;
        }
        out[entry[1] ?? ""] = entry[2] ?? "";
      }
      at = end;
    } else throw new BundleError("a graph file is not an ONNX model; re-export the bundle");
  }
  return out;
}

/**
 * Refuse a tokenizer file whose vocabulary fingerprint differs from the one manifest.json
 * ("vocabulary") or a graph's metadata_props (edgeseq.{side}_vocab_sha256) records; bundles
 * exported before fingerprints record none. `tokenizers`: {side: {name, data}}; `graphs`:
 * [{name, bytes}] of the .onnx files to be opened.
 */
export async function checkVocabulary(manifest, tokenizers, graphs) {
  for (const [side, { name, data }] of Object.entries(tokenizers)) {
    const records = [];
    const listed = manifest.vocabulary?.[side];
    if (listed !== undefined) records.push(["manifest.json", listed]);
    for (const graph of graphs) {
      const value = onnxMetadata(graph.bytes)[`edgeseq.${side}_vocab_sha256`];
      if (value !== undefined) records.push([graph.name, value]);
    }
    if (!records.length) continue;
    const got = await vocabularyFingerprint(data);
    for (const [where, want] of records) {
      if (want !== got) {
        throw new BundleError(
          `${name} does not match the vocabulary the graphs were exported with (fingerprint ` +
            `${got.slice(0, 16)}..., ${where} records ${String(want).slice(0, 16)}...); ` +
            "re-export the bundle or restore the file",
        );
      }
    }
  }
}
