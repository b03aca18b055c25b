// The bundle's tokenizer.json, read in the browser with no dependencies.
//
//   const tok = Tokenizer.fromJSON(await (await fetch("bundle/tokenizer.json")).json());
//   tok.encode("Hello")      // [12, 9, 16, 16, 19]: normalised, pre-tokenised, no specials
//   tok.decode([12, 9, 2])   // "he": specials dropped, stops at </s>
//
// It follows runtime/tokenizer.py (the `tokenizers` library) exactly for what edgeseq bundles
// contain: the added tokens (split out before normalisation), the normalizer the file declares
// (Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend,
// Precompiled), the pre-tokenizer (Split, WhitespaceSplit, Whitespace, Metaspace, ByteLevel,
// Sequence), the model (WordLevel: edgeseq's char and word tokenizers; Unigram: SentencePiece
// models such as MarianMT's, see unigram.mjs; BPE: byte-level ones such as BART's and
// SentencePiece ones such as NLLB's, see bpe.mjs), the decoder (Sequence, Replace, Metaspace,
// ByteLevel, ByteFallback, Fuse, Strip; none joins the tokens with spaces) and the
// post-processor (specials.mjs). Regexes are tokenizers' (Oniguruma) syntax, rewritten for
// JavaScript. Anything else is refused with an error naming it, never approximated.
//
// A bundle's file has edgeseq's <pad> <s> </s> <unk> at ids 0..3 (checked); any other
// tokenizer.json runs in its own ids with Tokenizer.fromJSON(data, { bundle: false }).

import {
  Precompiled,
  TokenizerError,
  Unigram,
  findMatches,
  patternRegex,
  replaceMatches,
} from "./unigram.mjs";
import { BPE, byteFallbackDecoder, byteLevelDecoder, byteLevelPreTokenizer } from "./bpe.mjs";
import { WORD_CHAR, addedMatcher, buildPostProcessor, splitAdded } from "./specials.mjs";

export { TokenizerError };

const SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]; // ids 0..3 in every edgeseq tokenizer

/** A function string -> string for a `normalizer` entry (null: identity). */
export function buildNormalizer(spec) {
  if (spec === null || spec === undefined) return (s) => s;
  switch (spec.type) {
    case "Sequence": {
      const steps = spec.normalizers.map(buildNormalizer);
      return (s) => steps.reduce((acc, f) => f(acc), s);
    }
    case "NFC":
    case "NFD":
    case "NFKC":
    case "NFKD":
      return (s) => s.normalize(spec.type);
    case "Lowercase":
      // Code point by code point, like tokenizers (Rust char::to_lowercase): String's
      // toLowerCase would turn a word-final capital sigma into final sigma instead.
      return (s) => Array.from(s, (c) => c.toLowerCase()).join("");
    case "Strip": {
      const left = spec.strip_left ?? true;
      const right = spec.strip_right ?? true;
      // Unicode White_Space, as tokenizers (Rust char::is_whitespace); String's trim
      // differs (it strips U+FEFF and keeps U+0085).
      return (s) => {
        let out = left ? s.replace(/^\p{White_Space}+/u, "") : s;
        out = right ? out.replace(/\p{White_Space}+$/u, "") : out;
        return out;
      };
    }
    case "StripAccents":
      return (s) => s.replace(/\p{Mn}/gu, "");
    case "Replace": {
      const re = patternRegex(spec.pattern, "Replace normalizer");
      return (s) => replaceMatches(re, s, spec.content);
    }
    case "Prepend":
      return (s) => (s.length ? spec.prepend + s : s);
    case "Precompiled": {
      const precompiled = new Precompiled(spec.precompiled_charsmap);
      return (s) => precompiled.normalize(s);
    }
    default:
      throw new TokenizerError(
        `normalizer ${JSON.stringify(spec.type)} is not supported by the web runtime; ` +
          "re-export the bundle with one of Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, " +
          "StripAccents, Replace, Prepend, Precompiled",
      );
  }
}

/** The pieces of `text` split at `matches` ([start, end, isMatch] covering it) the way
 * tokenizers' NormalizedString::split treats the delimiters; empty pieces dropped. */
function splitPieces(text, matches, behavior) {
  const out = []; // [start, end]
  let previous = false;
  const ordered = behavior === "MergedWithNext" ? [...matches].reverse() : matches;
  for (const [start, end, isMatch] of ordered) {
    const last = out[out.length - 1];
    if (behavior === "Removed" && isMatch) continue;
    if (behavior === "Contiguous" && isMatch === previous && last) last[1] = end;
    else if (behavior === "MergedWithPrevious" && isMatch && !previous && last) last[1] = end;
    else if (behavior === "MergedWithNext" && isMatch && !previous && last) last[0] = start;
    else out.push([start, end]);
    previous = isMatch;
  }
  if (behavior === "MergedWithNext") out.reverse();
  return out.filter(([start, end]) => end > start).map(([start, end]) => text.slice(start, end));
}

const BEHAVIORS = ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"];
const WHITESPACE_WORDS = new RegExp(`[${WORD_CHAR}]+|[^${WORD_CHAR}\\p{White_Space}]+`, "gu");

/** tokenizers' prepend_scheme of a Metaspace entry ("always", "first" or "never"). */
function prependScheme(spec) {
  if (spec.add_prefix_space === false) return "never";
  const scheme = spec.prepend_scheme ?? "always";
  if (!["always", "first", "never"].includes(scheme)) {
    throw new TokenizerError(`Metaspace prepend_scheme ${JSON.stringify(scheme)} is not supported`);
  }
  return scheme;
}

/** A function (string, atStart) -> string[] for a `pre_tokenizer` entry (null: the whole
 * text); atStart: the text begins at the input's first character. `normalized`: the file has
 * a normalizer (which may move the text's start away from the input's, for Metaspace). */
export function buildPreTokenizer(spec, nested = false, normalized = false) {
  if (spec === null || spec === undefined) return (s) => (s.length ? [s] : []);
  switch (spec.type) {
    case "Sequence": {
      const steps = spec.pretokenizers.map((step) => buildPreTokenizer(step, true));
      return (s) => steps.reduce((pieces, f) => pieces.flatMap((p) => f(p)), [s]);
    }
    case "Split": {
      const re = patternRegex(spec.pattern, "Split pre-tokenizer");
      if (!BEHAVIORS.includes(spec.behavior)) {
        const behavior = JSON.stringify(spec.behavior);
        throw new TokenizerError(`Split behavior ${behavior} is not supported`);
      }
      const flip = Boolean(spec.invert);
      return (s) => {
        const matches = findMatches(re, s).map(([a, b, isMatch]) => [a, b, isMatch !== flip]);
        return splitPieces(s, matches, spec.behavior);
      };
    }
    case "WhitespaceSplit":
      return (s) => s.split(/\p{White_Space}+/u).filter((p) => p.length);
    case "Whitespace":
      // tokenizers' \w+|[^\w\s]+ with Unicode \w (JavaScript's \w is ASCII only).
      return (s) => s.match(WHITESPACE_WORDS) ?? [];
    case "Metaspace": {
      const rep = String(spec.replacement);
      const scheme = prependScheme(spec);
      if (scheme === "first" && (nested || normalized)) {
        // tokenizers prepends where the piece's first character comes from the input's first,
        // which needs its offset alignments through the normalizer and the Sequence.
        throw new TokenizerError(
          "Metaspace prepend_scheme first is supported alone, without a normalizer or a Sequence",
        );
      }
      const split = spec.split ?? true;
      return (s, atStart = false) => {
        let t = s.replaceAll(" ", rep);
        const prepend = scheme === "always" || (scheme === "first" && atStart);
        if (prepend && t.length && !t.startsWith(rep)) t = rep + t;
        if (!split) return t.length ? [t] : [];
        const matches = [];
        let prev = 0;
        for (let i = t.indexOf(rep); i >= 0; i = t.indexOf(rep, i + rep.length)) {
          if (i > prev) matches.push([prev, i, false]);
          matches.push([i, i + rep.length, true]);
          prev = i + rep.length;
        }
        if (prev < t.length) matches.push([prev, t.length, false]);
        return splitPieces(t, matches, "MergedWithNext");
      };
    }
    case "ByteLevel":
      return byteLevelPreTokenizer(spec);
    default:
      throw new TokenizerError(
        `pre-tokenizer ${JSON.stringify(spec.type)} is not supported by the web runtime; ` +
          "supported: Split, WhitespaceSplit, Whitespace, Metaspace, ByteLevel, Sequence",
      );
  }
}

/** A function string[] -> string[] for a `decoder` entry (tokenizers' decode_chain). */
export function buildDecoder(spec) {
  switch (spec.type) {
    case "Sequence": {
      const steps = spec.decoders.map(buildDecoder);
      return (tokens) => steps.reduce((acc, f) => f(acc), tokens);
    }
    case "Fuse":
      return (tokens) => [tokens.join("")];
    case "ByteLevel":
      return byteLevelDecoder;
    case "ByteFallback":
      return byteFallbackDecoder;
    case "Replace": {
      const re = patternRegex(spec.pattern, "Replace decoder");
      return (tokens) => tokens.map((t) => replaceMatches(re, t, spec.content));
    }
    case "Metaspace": {
      // Every replacement becomes a space, except in the first token unless "never".
      const rep = String(spec.replacement);
      const never = prependScheme(spec) === "never";
      return (tokens) => tokens.map((t, i) => t.replaceAll(rep, i === 0 && !never ? "" : " "));
    }
    case "Strip": {
      const [content, start, stop] = [String(spec.content), spec.start ?? 0, spec.stop ?? 0];
      return (tokens) =>
        tokens.map((t) => {
          const chars = Array.from(t);
          let first = 0;
          while (first < Math.min(start, chars.length) && chars[first] === content) first++;
          let end = chars.length;
          while (chars.length - end < stop && end > first && chars[end - 1] === content) end--;
          return chars.slice(first, end).join("");
        });
    }
    default:
      throw new TokenizerError(
        `decoder ${JSON.stringify(spec.type)} is not supported by the web runtime; ` +
          "supported: Sequence, Replace, Metaspace, ByteLevel, ByteFallback, Fuse, Strip",
      );
  }
}

/** edgeseq's char and word vocabularies: one id per pre-token, `unk_token` when absent. */
class WordLevel {
  constructor(model) {
    this.ids = new Map(Object.entries(model.vocab ?? {}));
    this.tokens = [];
    for (const [token, id] of this.ids) this.tokens[id] = token;
    this.unkId = this.ids.get(model.unk_token ?? "<unk>");
  }

  tokenToId(token) {
    return this.ids.get(token);
  }

  idToToken(id) {
    return this.tokens[id];
  }

  tokenize(word) {
    return [this.ids.get(word) ?? this.unkId];
  }
}

const MODELS = { WordLevel, Unigram, BPE };

export class Tokenizer {
  /** Build from the parsed JSON of a tokenizer file: a bundle's (`bundle`, the default:
   * edgeseq's special tokens at ids 0..3), or any tokenizer.json in its own ids. */
  static fromJSON(data, { bundle = true } = {}) {
    const model = data.model ?? {};
    if (!Object.hasOwn(MODELS, model.type)) {
      throw new TokenizerError(
        `tokenizer model ${JSON.stringify(model.type)} is not supported by the web runtime; ` +
          "only WordLevel (edgeseq's char and word tokenizers), Unigram and BPE are",
      );
    }
    return new Tokenizer(data, new MODELS[model.type](model), bundle);
  }

  constructor(data, model, bundle = true) {
    this.model = model;
    this.normalize = buildNormalizer(data.normalizer);
    this.preTokenize = buildPreTokenizer(data.pre_tokenizer, false, Boolean(data.normalizer));
    this.decoder = data.decoder ? buildDecoder(data.decoder) : null;
    this.postProcess = buildPostProcessor(data.post_processor);
    this.addedIds = new Map(); // content -> id
    this.addedTokens = new Map(); // id -> content
    this.specialTokens = new Set(); // contents of the special added tokens, dropped by decode
    const raw = [];
    const normalized = [];
    for (const t of data.added_tokens ?? []) {
      this.addedIds.set(t.content, t.id);
      this.addedTokens.set(t.id, t.content);
      if (t.special) this.specialTokens.add(t.content);
      if (t.normalized ?? !t.special) normalized.push({ ...t, content: this.normalize(t.content) });
      else raw.push(t);
    }
    // Added tokens are matched in the raw text, or (normalized ones) in each normalised piece.
    this.rawAdded = addedMatcher(raw);
    this.normalizedAdded = addedMatcher(normalized);
    this.bundle = bundle;
    if (bundle) {
      SPECIAL_TOKENS.forEach((token, id) => {
        if (this.tokenToId(token) !== id) {
          const fix = "retrain it with edgeseq";
          throw new TokenizerError(`tokenizer must have ${token} at id ${id}; ${fix}`);
        }
      });
    }
    this.unkId = bundle ? 3 : model.unkId; // a bundle's <unk>, whatever its model declares
    this.eosId = bundle ? 2 : null;
  }

  tokenToId(token) {
    return this.addedIds.get(token) ?? this.model.tokenToId(token);
  }

  idToToken(id) {
    return this.addedTokens.get(id) ?? this.model.idToToken(id);
  }

  /** Token ids of `text`; unknown symbols become <unk>. `addSpecialTokens`: the file's
   * post-processor adds its special tokens (edgeseq's runtimes add their own instead). */
  encode(text, addSpecialTokens = false) {
    const ids = [];
    splitAdded(text, this.rawAdded).forEach(([piece, addedId], i) => {
      if (addedId !== null) return void ids.push(addedId);
      splitAdded(this.normalize(piece), this.normalizedAdded).forEach(([part, partId], j) => {
        if (partId !== null) return void ids.push(partId);
        for (const word of this.preTokenize(part, i === 0 && j === 0)) {
          for (const id of this.model.tokenize(word)) ids.push(id);
        }
      });
    });
    return addSpecialTokens ? this.postProcess(ids) : ids;
  }

  /** Text of `ids`: a bundle's stops at </s> and drops ids 0..3; the special added tokens are
   * dropped, then the file's decoder runs (none: tokens joined with spaces). */
  decode(ids) {
    const kept = [];
    for (const id of ids) {
      if (id === this.eosId) break;
      if (this.bundle && id < SPECIAL_TOKENS.length) continue;
      const token = this.idToToken(id);
      if (token !== undefined && !this.specialTokens.has(token)) kept.push(token);
    }
    return this.decoder ? this.decoder(kept).join("") : kept.join(" ");
  }
}

// -- vocabulary fingerprints (runtime/vocabulary.py, docs/bundle.md) -------------------------

/** RFC 8785 (JCS) text of a parsed JSON value: keys sorted by UTF-16 code units, no spaces. */
export function canonicalJSON(value) {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(canonicalJSON).join(",")}]`;
  const keys = Object.keys(value).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJSON(value[k])}`).join(",")}}`;
}

/** The object whose canonical JSON a vocabulary fingerprint hashes (see vocabulary.py). */
export function fingerprinted(data) {
  const model = { ...(data.model ?? {}) };
  const vocab = model.vocab;
  delete model.vocab;
  const pairs = new Map(); // JSON of [id, token] -> [id, token]: distinct pairs
  const add = (id, token) => pairs.set(JSON.stringify([id, String(token)]), [id, String(token)]);
  if (Array.isArray(vocab)) {
    vocab.forEach((entry, id) => add(id, entry[0])); // Unigram: [token, score], index = id
    model.vocab = vocab.map((entry) => entry[1]);
  } else if (vocab && typeof vocab === "object") {
    for (const [token, id] of Object.entries(vocab)) add(id, token);
  }
  for (const t of data.added_tokens ?? []) add(t.id, t.content);
  if (Array.isArray(model.merges)) {
    model.merges = model.merges.map((m) => {
      if (typeof m !== "string") return m;
      const space = m.indexOf(" ");
      return space < 0 ? [m] : [m.slice(0, space), m.slice(space + 1)];
    });
  }
  const ordered = [...pairs.values()].sort(
    (a, b) => a[0] - b[0] || (a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0),
  );
  return {
    vocab: ordered,
    model,
    normalizer: data.normalizer ?? null,
    pre_tokenizer: data.pre_tokenizer ?? null,
    decoder: data.decoder ?? null,
  };
}

/** Hex sha256 fingerprint of a parsed tokenizer.json (WebCrypto: https or localhost). */
export async function vocabularyFingerprint(data) {
  const bytes = new TextEncoder().encode(canonicalJSON(fingerprinted(data)));
  const digest = await globalThis.crypto.subtle.digest("SHA-256", bytes);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}
