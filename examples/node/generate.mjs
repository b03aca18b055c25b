// Generate with an edgeseq bundle's one-graph search variant: one session.run, no loop.
//
//   npm run setup                       # onnxruntime-node (CPU), no install scripts
//   node generate.mjs BUNDLE [--beam N] [--max-new-tokens N] WORD...
//
// Prints one output per input, like `edgeseq generate BUNDLE --beam N WORD...`. Needs a
// bundle exported with `edgeseq export --variants fp32,search` (docs/bundle.md, "The
// one-graph search variant"). The tokenizers are read from the bundle's tokenizer.json
// files; this example handles edgeseq's "char" and "word" tokenizers (WordLevel models).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as ort from "onnxruntime-node";

function fail(message) {
  console.error(`error: ${message}`);
  process.exit(1);
}

function parseArgs(argv) {
  const options = { beam: 1, maxNewTokens: null, words: [] };
  let bundle = null;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--beam" || arg === "--max-new-tokens") {
      const value = Number.parseInt(argv[++i], 10);
      if (!(value >= 1)) fail(`${arg} needs a positive integer`);
      if (arg === "--beam") options.beam = value;
      else options.maxNewTokens = value;
    } else if (bundle === null) {
      bundle = arg;
    } else {
      options.words.push(arg);
    }
  }
  if (bundle === null) fail("usage: node generate.mjs BUNDLE [--beam N] [--max-new-tokens N] WORD...");
  return { bundle, ...options };
}

function readJson(path) {
  try {
    return JSON.parse(readFileSync(path, "utf8"));
  } catch (error) {
    fail(`cannot read ${path}: ${error.message}`);
  }
}

// A WordLevel tokenizer of edgeseq: "char" (every character a token) or "word" (whitespace).
// Decoding drops the special tokens (ids below `firstRegular`), as edgeseq's decode does.
function loadTokenizer(path, firstRegular) {
  const data = readJson(path);
  if (data.model.type !== "WordLevel") fail(`${path}: only char and word tokenizers are handled`);
  const vocab = data.model.vocab;
  const byId = [];
  for (const [token, id] of Object.entries(vocab)) byId[id] = token;
  const split = data.pre_tokenizer?.type === "WhitespaceSplit"
    ? (text) => text.split(/\s+/).filter((t) => t.length > 0)
    : (text) => Array.from(text);
  const joiner = data.decoder?.type === "Fuse" ? "" : " ";
  return {
    encode: (text) => split(text).map((t) => vocab[t] ?? vocab[data.model.unk_token]),
    decode: (ids) => ids.filter((id) => id >= firstRegular).map((id) => byId[id]).join(joiner),
  };
}

const args = parseArgs(process.argv.slice(2));
const manifest = readJson(join(args.bundle, "manifest.json"));
const config = readJson(join(args.bundle, "config.json"));
const search = manifest.search?.fp32;
if (!search) fail(`${args.bundle} has no search variant; export it with --variants fp32,search`);

const special = config.special_tokens; // {pad, bos, eos, unk}: {id, token}
const firstRegular = 1 + Math.max(...Object.values(special).map((s) => s.id));
const source = loadTokenizer(join(args.bundle, config.tokenizers.source), firstRegular);
const target = loadTokenizer(join(args.bundle, config.tokenizers.target), firstRegular);
const maxLen = config.model.max_len;
const steps = Math.min(args.maxNewTokens ?? maxLen, maxLen);

// Source ids: tokens + </s>, right-padded with <pad>; the mask is 1 at real tokens.
const rows = args.words.map((word) => [...source.encode(word), special.eos.id]);
const width = Math.max(1, ...rows.map((row) => row.length));
if (width > maxLen) fail(`an input has ${width} tokens with </s>; the model's max_len is ${maxLen}`);
const ids = new Int32Array(rows.length * width).fill(special.pad.id);
const mask = new Int32Array(rows.length * width);
rows.forEach((row, r) => row.forEach((id, c) => {
  ids[r * width + c] = id;
  mask[r * width + c] = 1;
}));

if (rows.length > 0) {
  const scalar = (value, type) => new ort.Tensor(type, type === "int32" ? Int32Array.of(value) : Float32Array.of(value), [1]);
  const session = await ort.InferenceSession.create(join(args.bundle, search.file));
  const { sequences } = await session.run({
    input_ids: new ort.Tensor("int32", ids, [rows.length, width]),
    attention_mask: new ort.Tensor("int32", mask, [rows.length, width]),
    max_length: scalar(steps + 1, "int32"), // the leading <s> counts
    min_length: scalar(0, "int32"),
    num_beams: scalar(args.beam, "int32"),
    num_return_sequences: scalar(1, "int32"),
    length_penalty: scalar(1.0, "float32"),
    repetition_penalty: scalar(1.0, "float32"),
  });
  // sequences: int32 [batch, 1, max_length]: <s>, the tokens, then -1 (</s> left out).
  const length = sequences.dims[2];
  for (let r = 0; r < rows.length; r++) {
    const out = [];
    for (let t = 1; t < length; t++) {
      const id = sequences.data[r * length + t];
      if (id === -1) break;
      out.push(id);
    }
    console.log(target.decode(out));
  }
}
