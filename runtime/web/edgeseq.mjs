// edgeseq in the browser: load a bundle and decode greedily with onnxruntime-web (wasm).
//
//   import * as ort from "./ort/ort.wasm.min.mjs";        // onnxruntime-web's dist folder
//   import { Bundle } from "./edgeseq.mjs";
//   const bundle = await Bundle.load(ort, "./bundle/", { variant: "int8" });
//   await bundle.generate("hello")                           // "HH AH0 L OW1"
//
//   // the one-graph search variant (`edgeseq export --variants fp32,int8,search`):
//   const graph = await Bundle.load(ort, "./bundle/", { variant: "int8", search: "graph" });
//   await graph.generateInGraph("hello", { beams: 4 })       // one session.run, no JS loop
//
// The bundle is the directory `edgeseq export` writes (docs/bundle.md): config.json,
// manifest.json, tokenizer.json (and tokenizer.target.json), and the two graphs of the chosen
// variant as the manifest names them. Every file is checked against the manifest's sha256, and
// each tokenizer against the vocabulary fingerprint the manifest and graphs record, when the
// page has WebCrypto (https or 127.0.0.1/localhost). Inputs and outputs are fed and read by
// the names config.json lists, like runtime/kinds/seq2seq.py: encoder src_ids int64 [1, S] ->
// memory and cross_k.i / cross_v.i float32 (float16 in the fp16 variant) [1, H, S, Dh];
// decoder input_ids int64 [1, 1], past_k.i / past_v.i [1, H, P, Dh] (the cross K/V's type),
// cross K/V, src_mask bool [1, S] -> logits float32 [1, 1, V] and present_k.i / present_v.i
// [1, H, P + 1, Dh]. Greedy: arg-max, lowest id on ties, as
// runtime/search.py; one word at a time (batch 1). The search variant is one
// com.microsoft.BeamSearch graph fed the inputs of docs/bundle.md ("The one-graph search
// variant"); its hypotheses are re-ranked as runtime/graph_search.py re-ranks them.

import { graphVariantProblem } from "./graph_variants.mjs";
import { forcedTargetIds, generationDefaults, Languages, noLanguages } from "./languages.mjs";
import { LanguageError, OptionsError } from "./languages.mjs";
import { Tokenizer, TokenizerError, vocabularyFingerprint } from "./tokenizer.mjs";
import { BundleError, checkVocabulary, onnxMetadata } from "./vocabulary_check.mjs";

export { BundleError, checkVocabulary, LanguageError, onnxMetadata, OptionsError };
export { Tokenizer, TokenizerError };
export { vocabularyFingerprint };

/** Which graphs Bundle.load opens: the two-graph loop, the search graph, or both. */
export const SEARCH_MODES = ["loop", "graph", "both"];
// runtime/config.py RELATIVE_MAX_POSITIONS: positional "relative" has no table to cap positions
export const RELATIVE_MAX_POSITIONS = 65536;

async function fetchBytes(url) {
  let response;
  try {
    response = await fetch(url);
  } catch (err) {
    throw new BundleError(`cannot fetch ${url}: ${err.message}; is the bundle served there?`);
  }
  if (!response.ok) {
    throw new BundleError(`cannot fetch ${url}: HTTP ${response.status}; serve the bundle there`);
  }
  return new Uint8Array(await response.arrayBuffer());
}

/** The name of graph `name`'s external data file (`NAME.data`: the weights of a graph over
 * the exporter's size threshold) when the manifest lists one, else null. */
function externalDataFile(manifest, name) {
  const data = `${name}.data`;
  return manifest.files?.[data] ? data : null;
}

async function sha256Hex(bytes) {
  const digest = await globalThis.crypto.subtle.digest("SHA-256", bytes);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

function parseJSON(bytes, name) {
  try {
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch (err) {
    throw new BundleError(`${name} is not valid JSON (${err.message}); re-export the bundle`);
  }
}

/** Input/output names of a graph from config.json's "io" section, grouped by family. */
function ioNames(config, graph, side) {
  const entries = config.io?.[graph]?.[side];
  if (!Array.isArray(entries)) {
    throw new BundleError(`config.json has no io.${graph}.${side}; re-export the bundle`);
  }
  const byFamily = {};
  for (const { name, dtype } of entries) {
    const family = name.split(".", 1)[0];
    (byFamily[family] ??= []).push({ name, dtype });
  }
  return byFamily;
}

export class Bundle {
  /**
   * Fetch and check a bundle and open the graphs of `variant` (default "fp32"): its two
   * graphs for generate() with `search` "loop" (the default), its one-graph search file for
   * generateInGraph() with "graph", all three with "both". `ort` is the onnxruntime-web
   * module; `baseUrl` the bundle directory's URL.
   */
  static async load(ort, baseUrl, { variant = "fp32", search = "loop", sessionOptions = {} } = {}) {
    if (!SEARCH_MODES.includes(search)) {
      throw new BundleError(`search is ${search}; use one of ${SEARCH_MODES.join(", ")}`);
    }
    const base = baseUrl.endsWith("/") ? baseUrl : `${baseUrl}/`;
    const manifest = parseJSON(await fetchBytes(`${base}manifest.json`), "manifest.json");
    const entry = manifest.variants?.[variant];
    if (!entry) {
      const known = Object.keys(manifest.variants ?? {}).join(", ");
      throw new BundleError(`the bundle has no variant ${variant}; it has: ${known}`);
    }
    const problem = graphVariantProblem(manifest);
    if (problem) throw new BundleError(problem);
    if (entry.format && entry.format !== "onnx") {
      throw new BundleError(`variant ${variant} is ${entry.format}; the web runtime runs .onnx`);
    }
    const verify = Boolean(globalThis.crypto?.subtle);
    const get = async (name) => {
      const bytes = await fetchBytes(`${base}${name}`);
      const want = manifest.files?.[name]?.sha256;
      if (!want) throw new BundleError(`${name} is not listed in manifest.json`);
      if (verify && (await sha256Hex(bytes)) !== want) {
        throw new BundleError(`${name} does not match its sha256 in manifest.json; re-export`);
      }
      return bytes;
    };
    const config = parseJSON(await get("config.json"), "config.json");
    const architecture = config.model?.architecture ?? "encoder-decoder";
    if (architecture !== "encoder-decoder") {
      throw new BundleError(
        `the bundle is ${architecture}; the web runtime runs encoder-decoder bundles only`,
      );
    }
    const names = config.tokenizers ?? { source: "tokenizer.json", target: "tokenizer.json" };
    const sourceData = parseJSON(await get(names.source), names.source);
    const targetData =
      names.target === names.source
        ? sourceData
        : parseJSON(await get(names.target), names.target);
    const source = Tokenizer.fromJSON(sourceData);
    const target = names.target === names.source ? source : Tokenizer.fromJSON(targetData);
    const options = { executionProviders: ["wasm"], ...sessionOptions };
    // A graph with external data gets its data file as onnxruntime-web's `externalData`
    // (the graph names it by this relative path).
    const open = async ({ name, bytes, data }) => {
      const graphOptions = data
        ? { ...options, externalData: [{ path: data.name, data: data.bytes }] }
        : options;
      try {
        return await ort.InferenceSession.create(bytes, graphOptions);
      } catch (err) {
        throw new BundleError(`onnxruntime-web cannot load ${name}: ${err.message ?? err}`);
      }
    };
    const files = search === "graph" ? [] : [entry.encoder, entry.decoder];
    if (search !== "loop") {
      const file = manifest.search?.[variant]?.file;
      if (!file) {
        throw new BundleError(
          `the bundle has no search graph for variant ${variant}; export it with ` +
            `--variants fp32,int8,search, or load it with search: "loop"`,
        );
      }
      files.push(file);
    }
    const graphFiles = await Promise.all(
      files.map(async (name) => {
        const dataName = externalDataFile(manifest, name);
        const data = dataName ? { name: dataName, bytes: await get(dataName) } : null;
        return { name, bytes: await get(name), data };
      }),
    );
    if (verify) {
      const sides = {
        source: { name: names.source, data: sourceData },
        target: { name: names.target, data: targetData },
      };
      await checkVocabulary(manifest, sides, graphFiles);
    }
    const sessions = await Promise.all(graphFiles.map(open));
    const [encoder, decoder] = search === "graph" ? [null, null] : sessions;
    const graphs = { encoder, decoder, search: search === "loop" ? null : sessions.at(-1) };
    return new Bundle(ort, config, source, target, graphs, { variant, search, verified: verify });
  }

  constructor(ort, config, source, target, graphs, info) {
    this.ort = ort;
    this.config = config;
    this.model = config.model;
    this.source = source;
    this.target = target;
    this.encoder = graphs.encoder;
    this.decoder = graphs.decoder;
    this.searchGraph = graphs.search;
    this.info = info;
    this.encoderOut = ioNames(config, "encoder", "outputs");
    this.decoderIn = ioNames(config, "decoder", "inputs");
    this.decoderOut = ioNames(config, "decoder", "outputs");
    const dtype = this.decoderIn.past_k?.[0]?.dtype;
    if (dtype !== "float32") {
      throw new BundleError(`cache dtype ${dtype} is not supported; use the fp32 or int8 variant`);
    }
    this.languages = Languages.fromConfig(config.languages, target); // null: none
    this.generation = generationDefaults(config); // what the searches apply, what they do not
  }

  /** {source, target}: the ids before a source's tokens and those forced first in its
   * output (the target language, then `targetPrefix`'s ids: `forcedTargetIds`), for per-call
   * `{sourceLang, targetLang, targetPrefix}` (the config's default languages when absent). */
  prefixes({ sourceLang, targetLang, targetPrefix } = {}) {
    const bos = this.model.source_bos ? [this.model.bos_id] : []; // BART: <s> tokens </s>
    if (!this.languages) noLanguages({ sourceLang, targetLang });
    const source = [...bos, ...(this.languages?.sourcePrefix(sourceLang) ?? [])];
    const target = forcedTargetIds(this.languages, this.target, { targetLang, targetPrefix });
    return { source, target };
  }

  /** Positions a source or an output may use: max_len (the positional table's rows), or for
   * positional "relative" (T5's: no table) RELATIVE_MAX_POSITIONS, as Python's
   * ModelConfig.max_positions; max_len stays the default budget. */
  get maxPositions() {
    return this.model.positional === "relative" ? RELATIVE_MAX_POSITIONS : this.model.max_len;
  }

  /** The tokens an output may have: `maxNewTokens` (else the bundle's default, else max_len)
   * within maxPositions. */
  budget(maxNewTokens = this.generation.maxNewTokens) {
    return Math.min(maxNewTokens ?? this.model.max_len, this.maxPositions);
  }

  /** The ids `generate` forces first for these per-call options (`prefixes().target`);
   * OptionsError, as Python's Generator.resolve, when they leave no token of the budget. */
  forcedIds({ sourceLang, targetLang, targetPrefix, maxNewTokens } = {}) {
    const forced = this.prefixes({ sourceLang, targetLang, targetPrefix }).target;
    const budget = this.budget(maxNewTokens);
    if (forced.length >= budget) {
      throw new OptionsError(
        `the forced target prefix takes ${forced.length} of the ${budget} tokens an ` +
          "output may have: raise maxNewTokens or shorten targetPrefix",
      );
    }
    return forced;
  }

  /**
   * Source ids of `text` plus </s>, after `<s>` (source_bos) and the source language's token
   * (a bundle with languages; `sourceLang` or its default); longer than max_len is an error,
   * as in Python. An input with no token after normalisation, or with unknown symbols only,
   * is not run (Python's `Source.skipped` "empty" / "unknown"): null.
   */
  encode(text, { sourceLang } = {}) {
    const tokens = this.source.encode(text);
    if (tokens.every((id) => id === this.source.unkId)) return null;
    const ids = [...this.prefixes({ sourceLang }).source, ...tokens, this.model.eos_id];
    if (ids.length > this.maxPositions) {
      throw new BundleError(
        `input has ${ids.length} source tokens with </s> but the model's max_len is ` +
          `${this.maxPositions}; shorten it`,
      );
    }
    return ids;
  }

  /** Greedy output ids (without <s> and </s>) for source ids int64 [S]: the ids of `forced`
   * first (a target language and prefix, log-probability 0, part of the output), then
   * arg-max, at most `maxNewTokens` (the bundle's default, else max_len) within max_len;
   * with the bundle's forced_eos, </s> at the last step of that budget. */
  async greedyIds(srcIds, { forced = [], maxNewTokens = this.generation.maxNewTokens } = {}) {
    if (!this.decoder) {
      throw new BundleError('the bundle was loaded with search: "graph"; use generateInGraph');
    }
    const { Tensor } = this.ort;
    const S = srcIds.length;
    const H = this.model.n_heads;
    const dHead = this.model.head_dim ?? this.model.d_model / this.model.n_heads;
    const src = new Tensor("int64", BigInt64Array.from(srcIds, BigInt), [1, S]);
    const srcName = ioNames(this.config, "encoder", "inputs").src_ids[0].name;
    const enc = await this.encoder.run({ [srcName]: src });
    const feeds = {
      [this.decoderIn.src_mask[0].name]: new Tensor(
        "bool",
        Uint8Array.from(srcIds, (id) => (id !== this.model.pad_id ? 1 : 0)),
        [1, S],
      ),
    };
    for (const family of ["cross_k", "cross_v"]) {
      this.decoderIn[family].forEach(({ name }, i) => {
        feeds[name] = enc[this.encoderOut[family][i].name];
      });
    }
    // The cache is in the encoder's cross K/V type: float32, or float16 in an fp16 bundle
    // (docs/bundle.md); the logits are float32 in both.
    const cacheType = enc[this.encoderOut.cross_k[0].name].type;
    const noValues = cacheType === "float16" ? new Uint16Array(0) : new Float32Array(0);
    const empty = new Tensor(cacheType, noValues, [1, H, 0, dHead]);
    for (const family of ["past_k", "past_v"]) {
      for (const { name } of this.decoderIn[family]) feeds[name] = empty;
    }
    const out = [];
    let last = this.model.decoder_start_id ?? this.model.bos_id; // the first token fed
    const inputName = this.decoderIn.input_ids[0].name;
    const logitsName = this.decoderOut.logits[0].name;
    const budget = this.budget(maxNewTokens);
    for (let step = 0; step < budget; step++) {
      feeds[inputName] = new Tensor("int64", BigInt64Array.of(BigInt(last)), [1, 1]);
      const result = await this.decoder.run(feeds);
      const logits = result[logitsName].data; // [1, 1, V]
      let best = 0;
      if (step < forced.length) best = forced[step];
      else if (this.generation.forcedEos && step === budget - 1) best = this.model.eos_id;
      else for (let v = 1; v < logits.length; v++) if (logits[v] > logits[best]) best = v;
      if (best === this.model.eos_id) break;
      out.push(best);
      last = best;
      for (const [past, present] of [
        ["past_k", "present_k"],
        ["past_v", "present_v"],
      ]) {
        this.decoderIn[past].forEach(({ name }, i) => {
          feeds[name] = result[this.decoderOut[present][i].name];
        });
      }
    }
    return out;
  }

  /** The greedy output text of one input; an input that `encode` skips gives "". Options:
   * `sourceLang`, `targetLang` (a bundle with languages: codes of config.json's list, its
   * defaults when absent, an unknown code refused with the list), `targetPrefix` (text the
   * output starts with, forced after the target language: `forcedIds`), `maxNewTokens`. */
  async generate(text, { sourceLang, targetLang, targetPrefix, maxNewTokens } = {}) {
    const forced = this.forcedIds({ sourceLang, targetLang, targetPrefix, maxNewTokens });
    const ids = this.encode(text, { sourceLang });
    if (!ids) return "";
    return this.target.decode(await this.greedyIds(ids, { forced, maxNewTokens }));
  }

  /**
   * Best output ids (without <s> and </s>) of each row of source ids from the search graph,
   * in one run for all rows (right-padded with <pad>, masked): greedy for beams 1, else beam
   * search ranked by logprob / length ** lengthPenalty, as runtime/graph_search.py ranks;
   * `beams`, `lengthPenalty`, `maxNewTokens` default to the bundle's generation settings.
   */
  async searchIds(rows, options = {}) {
    const defaults = this.generation;
    const { beams = defaults.beams, lengthPenalty = defaults.lengthPenalty } = options;
    const { maxNewTokens = defaults.maxNewTokens } = options;
    if (!this.searchGraph) {
      throw new BundleError(
        'the bundle was loaded without its search graph; load it with search: "graph"',
      );
    }
    if (!(Number.isInteger(beams) && beams >= 1)) {
      throw new BundleError(`beams is ${beams}; use a positive integer`);
    }
    const { Tensor } = this.ort;
    const B = rows.length;
    const S = Math.max(...rows.map((row) => row.length));
    const budget = this.budget(maxNewTokens);
    const int32 = (value) => new Tensor("int32", Int32Array.of(value), [1]);
    const float32 = (value) => new Tensor("float32", Float32Array.of(value), [1]);
    const ids = new Int32Array(B * S).fill(this.model.pad_id);
    rows.forEach((row, r) => ids.set(row, r * S));
    const mask = Int32Array.from(ids, (id) => (id !== this.model.pad_id ? 1 : 0));
    const result = await this.searchGraph.run({
      input_ids: new Tensor("int32", ids, [B, S]),
      attention_mask: new Tensor("int32", mask, [B, S]),
      max_length: int32(budget + 1), // the leading <s> counts
      min_length: int32(0),
      num_beams: int32(beams),
      num_return_sequences: int32(beams), // every beam: re-ranked below
      length_penalty: float32(lengthPenalty),
      repetition_penalty: float32(1.0),
    });
    // sequences int32 [B, beams, T]: <s>, the tokens, then -1 (</s> left out). onnxruntime
    // scores a hypothesis still open at the budget with one length unit more than a finished
    // one; rescore every hypothesis as runtime/graph_search.py does and keep the best. Where
    // beams reach the budget onnxruntime may have dropped a finished hypothesis the Python
    // loop ranks higher (graph_search.may_differ); Python then re-runs the loop, which this
    // module does not have for beams: its answer is onnxruntime's there.
    const { data, dims } = result.sequences;
    const scores = result.sequences_scores.data;
    const T = dims[2];
    return rows.map((_, b) => {
      let best = null;
      for (let r = 0; r < beams; r++) {
        const offset = (b * beams + r) * T;
        const tokens = [];
        for (let t = 1; t < T && data[offset + t] !== -1; t++) tokens.push(data[offset + t]);
        const finished = tokens.length < budget ? 1 : 0;
        const logprob = scores[b * beams + r] * (tokens.length + 1) ** lengthPenalty;
        const score = logprob / Math.max(tokens.length + finished, 1) ** lengthPenalty;
        if (best === null || score > best.score) best = { tokens, score };
      }
      return best.tokens;
    });
  }

  /**
   * Outputs from the one-graph search variant, as `edgeseq generate --search graph` gives
   * them: greedy by default, beam search with `beams` > 1. `texts` is one text (-> its
   * output) or an array (-> an array of outputs, in order), run as the CLI runs its input
   * lines: chunks of `batchSize` in input order, each chunk's inputs that are run one batch in
   * input order (with int8 graphs the batch can change a near-tied output, so the same
   * batches give the same outputs). An input that `encode` skips gives "" without running.
   */
  async generateInGraph(texts, { batchSize = 32, sourceLang, targetLang, ...options } = {}) {
    const languages = { sourceLang, targetLang };
    if (!Array.isArray(texts)) {
      return (await this.generateInGraph([texts], { batchSize, ...languages, ...options }))[0];
    }
    const { targetPrefix, ...search } = options;
    if (this.prefixes({ ...languages, targetPrefix }).target.length) {
      throw new BundleError(
        "the one-graph search forces no target language or prefix; use generate() for them",
      );
    }
    const sources = texts.map((text) => this.encode(text, { sourceLang }));
    const out = texts.map(() => "");
    for (let start = 0; start < texts.length; start += batchSize) {
      const todo = [];
      for (let i = start; i < Math.min(start + batchSize, texts.length); i++) {
        if (sources[i]) todo.push(i);
      }
      if (todo.length === 0) continue;
      const best = await this.searchIds(todo.map((i) => sources[i]), search);
      todo.forEach((i, k) => {
        out[i] = this.target.decode(best[k]);
      });
    }
    return out;
  }
}
