// The bundle's tokenizer.json, read in the browser with no dependencies.
//
//   const tok = Tokenizer.fromJSON(await (await fetch("bundle/tokenizer.json")).json());
//   tok.encode("Hello")      // [12, 9, 16, 16, 19]: normalised, pre-tokenised, no specials
//   tok.decode([12, 9, 2])   // "he": specials dropped, stops at </s>
//
// It follows runtime/tokenizer.py exactly for what edgeseq bundles contain: the normalizer the
// file declares (Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace,
// Prepend), the pre-tokenizer (Split, WhitespaceSplit, Whitespace, Sequence), a WordLevel
// vocabulary with its unknown token, and the decoder (Fuse joins tokens, none joins them with
// spaces). Anything else is refused with an error naming it, never approximated.

const SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]; // ids 0..3 in every edgeseq tokenizer

export class TokenizerError extends Error {
  constructor(message) {
    super(message);
    this.name = "TokenizerError";
  }
}

// tokenizers' regexes (Oniguruma) read \s and \S as Unicode White_Space; JavaScript's \s
// differs (it matches U+FEFF, not U+0085). Rewrite the unescaped ones.
function oniguruma(source) {
  return source.replace(/(?<=(?:^|[^\\])(?:\\\\)*)\\([sS])/g, (_, s) =>
    s === "s" ? "\\p{White_Space}" : "\\P{White_Space}",
  );
}

function patternRegex(pattern, where) {
  if (pattern && typeof pattern.Regex === "string") {
    return new RegExp(oniguruma(pattern.Regex), "gu");
  }
  if (pattern && typeof pattern.String === "string") {
    return new RegExp(pattern.String.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "gu");
  }
  throw new TokenizerError(`${where}: pattern must be {"Regex": ...} or {"String": ...}`);
}

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
      return (s) => s.replace(re, () => spec.content);
    }
    case "Prepend":
      return (s) => (s.length ? spec.prepend + s : s);
    default:
      throw new TokenizerError(
        `normalizer ${JSON.stringify(spec.type)} is not supported by the web runtime; ` +
          "re-export the bundle with one of Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, " +
          "StripAccents, Replace, Prepend",
      );
  }
}

/** Split `text` by the matches of `re` the way tokenizers' SplitDelimiterBehavior does. */
function splitBy(text, re, behavior, invert) {
  const pieces = []; // [string, isMatch]
  let last = 0;
  for (const m of text.matchAll(re)) {
    if (m[0].length === 0) continue;
    if (m.index > last) pieces.push([text.slice(last, m.index), false]);
    pieces.push([m[0], true]);
    last = m.index + m[0].length;
  }
  if (last < text.length) pieces.push([text.slice(last), false]);
  const marked = pieces.map(([s, isMatch]) => [s, invert ? !isMatch : isMatch]);
  switch (behavior) {
    case "Isolated":
      return marked.map(([s]) => s);
    case "Removed":
      return marked.filter(([, isDelim]) => !isDelim).map(([s]) => s);
    case "MergedWithPrevious": {
      const out = [];
      for (const [s, isDelim] of marked) {
        if (isDelim && out.length) out[out.length - 1] += s;
        else out.push(s);
      }
      return out;
    }
    case "MergedWithNext": {
      const out = [];
      let pending = "";
      for (const [s, isDelim] of marked) {
        if (isDelim) pending += s;
        else {
          out.push(pending + s);
          pending = "";
        }
      }
      if (pending) out.push(pending);
      return out;
    }
    case "Contiguous": {
      const out = [];
      let prevDelim = null;
      for (const [s, isDelim] of marked) {
        if (isDelim && prevDelim === true) out[out.length - 1] += s;
        else out.push(s);
        prevDelim = isDelim;
      }
      return out;
    }
    default:
      throw new TokenizerError(`Split behavior ${JSON.stringify(behavior)} is not supported`);
  }
}

const WORD_CHAR = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}";
const WHITESPACE_WORDS = new RegExp(`[${WORD_CHAR}]+|[^${WORD_CHAR}\\p{White_Space}]+`, "gu");

/** A function string -> string[] for a `pre_tokenizer` entry (null: the whole text). */
export function buildPreTokenizer(spec) {
  if (spec === null || spec === undefined) return (s) => (s.length ? [s] : []);
  switch (spec.type) {
    case "Sequence": {
      const steps = spec.pretokenizers.map(buildPreTokenizer);
      return (s) => steps.reduce((pieces, f) => pieces.flatMap(f), [s]);
    }
    case "Split": {
      const re = patternRegex(spec.pattern, "Split pre-tokenizer");
      return (s) => splitBy(s, re, spec.behavior, Boolean(spec.invert)).filter((p) => p.length);
    }
    case "WhitespaceSplit":
      return (s) => s.split(/\p{White_Space}+/u).filter((p) => p.length);
    case "Whitespace":
      // tokenizers' \w+|[^\w\s]+ with Unicode \w (JavaScript's \w is ASCII only).
      return (s) => s.match(WHITESPACE_WORDS) ?? [];
    default:
      throw new TokenizerError(
        `pre-tokenizer ${JSON.stringify(spec.type)} is not supported by the web runtime; ` +
          "supported: Split, WhitespaceSplit, Whitespace, Sequence",
      );
  }
}

export class Tokenizer {
  /** Build from the parsed JSON of a tokenizer file written by edgeseq. */
  static fromJSON(data) {
    const model = data.model ?? {};
    if (model.type !== "WordLevel") {
      throw new TokenizerError(
        `tokenizer model ${JSON.stringify(model.type)} is not supported by the web runtime; ` +
          "only WordLevel vocabularies (edgeseq's char and word tokenizers) are",
      );
    }
    const decoder = data.decoder ?? null;
    if (decoder !== null && decoder.type !== "Fuse") {
      throw new TokenizerError(`decoder ${JSON.stringify(decoder.type)} is not supported`);
    }
    return new Tokenizer(data, model.vocab, model.unk_token, decoder !== null);
  }

  constructor(data, vocab, unkToken, fuse) {
    this.vocab = new Map(Object.entries(vocab));
    this.tokens = [];
    for (const [token, id] of this.vocab) this.tokens[id] = token;
    SPECIAL_TOKENS.forEach((token, id) => {
      if (this.vocab.get(token) !== id) {
        throw new TokenizerError(`tokenizer must have ${token} at id ${id}; retrain it with edgeseq`);
      }
    });
    // Added tokens (specials) are matched before normalisation, as tokenizers does.
    this.added = (data.added_tokens ?? []).filter((t) => this.vocab.has(t.content));
    this.normalize = buildNormalizer(data.normalizer);
    this.preTokenize = buildPreTokenizer(data.pre_tokenizer);
    this.unkId = this.vocab.get(unkToken ?? "<unk>");
    this.fuse = fuse;
    this.eosId = 2;
  }

  /** Token ids of `text`, no special tokens added; unknown symbols become <unk>. */
  encode(text) {
    const ids = [];
    for (const [piece, isAdded] of this.splitAdded(text)) {
      if (isAdded) {
        ids.push(this.vocab.get(piece));
        continue;
      }
      for (const word of this.preTokenize(this.normalize(piece))) {
        ids.push(this.vocab.get(word) ?? this.unkId);
      }
    }
    return ids;
  }

  /** Pieces of `text`: [string, true] for an added token written out, else [string, false]. */
  splitAdded(text) {
    if (!this.added.length) return [[text, false]];
    const escaped = this.added
      .map((t) => t.content)
      .sort((a, b) => b.length - a.length)
      .map((s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    const re = new RegExp(escaped.join("|"), "gu");
    const out = [];
    let last = 0;
    for (const m of text.matchAll(re)) {
      if (m.index > last) out.push([text.slice(last, m.index), false]);
      out.push([m[0], true]);
      last = m.index + m[0].length;
    }
    if (last < text.length) out.push([text.slice(last), false]);
    return out;
  }

  /** Text of `ids`: stops at </s>, drops the special tokens, joins (Fuse) or spaces. */
  decode(ids) {
    const kept = [];
    for (const id of ids) {
      if (id === this.eosId) break;
      if (id >= SPECIAL_TOKENS.length) kept.push(this.tokens[id]);
    }
    return kept.join(this.fuse ? "" : " ");
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
