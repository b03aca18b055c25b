// What runtime/web/tokenizer.mjs needs for imported SentencePiece (Unigram) tokenizers, such
// as the files export/sources/marian_tokenizer.py writes for MarianMT, ported from the
// `tokenizers` library (Rust) that runtime/tokenizer.py runs:
//
//   new Precompiled(spec.precompiled_charsmap).normalize(text)   // SentencePiece's normaliser
//   new Unigram(data.model).tokenize("▁Hallo")                   // ids of one pre-token
//   new RegExp(oniguruma("\\A >>[\\s\\S]*?<<"), "gu")            // tokenizers' regex syntax
//
// Ports, not approximations. The charsmap is read as the crate spm_precompiled reads it (a
// Darts double-array trie over UTF-8 bytes, then NUL-terminated replacements), and text is
// rewritten one grapheme cluster at a time (Intl.Segmenter) taking the shortest mapped prefix,
// as it does. The Unigram keeps the best-scoring segmentation with tokenizers' tie-breaking,
// unknown-character score (the lowest score - 10) and fusing of consecutive unknowns. Regexes
// (Replace, Split) are Oniguruma's: rewritten for JavaScript, matched as its find_iter matches
// (an empty match right after a match is skipped); a construct JavaScript cannot express is
// refused with an error naming it.

/** A tokenizer file this runtime cannot read or run (tokenizer.mjs exports it too). */
export class TokenizerError extends Error {
  constructor(message) {
    super(message);
    this.name = "TokenizerError";
  }
}

function base64Bytes(text) {
  let binary;
  try {
    binary = atob(text);
  } catch {
    throw new TokenizerError("Precompiled normalizer: precompiled_charsmap is not base64");
  }
  return Uint8Array.from(binary, (c) => c.charCodeAt(0));
}

const UTF8 = new TextEncoder();
const UTF8_STRICT = new TextDecoder("utf-8", { fatal: true });

/**
 * SentencePiece's precompiled_charsmap: [uint32 LE trie size in bytes][trie units, uint32 LE]
 * [replacement strings, each NUL-terminated]. A trie value is the byte offset of a string.
 */
export class Precompiled {
  constructor(charsmapBase64) {
    const bytes = base64Bytes(charsmapBase64 ?? "");
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const units = bytes.length >= 4 ? Math.floor(view.getUint32(0, true) / 4) : -1;
    if (units < 0 || 4 + 4 * units > bytes.length) {
      throw new TokenizerError("Precompiled normalizer: precompiled_charsmap is truncated");
    }
    this.array = new Uint32Array(units);
    for (let i = 0; i < units; i++) this.array[i] = view.getUint32(4 + 4 * i, true);
    this.normalized = bytes.subarray(4 + 4 * units);
    try {
      UTF8_STRICT.decode(this.normalized);
    } catch {
      throw new TokenizerError("Precompiled normalizer: its strings are not UTF-8");
    }
    if (typeof Intl === "undefined" || typeof Intl.Segmenter !== "function") {
      throw new TokenizerError(
        "Precompiled normalizer needs Intl.Segmenter (grapheme clusters); update the browser",
      );
    }
    this.graphemes = new Intl.Segmenter("und", { granularity: "grapheme" });
    this.cache = new Map(); // grapheme cluster -> its normalised text
  }

  /** The first (shortest) value the trie holds for a prefix of `key` (bytes), or -1. */
  firstPrefixValue(key) {
    const a = this.array;
    const offset = (unit) => (unit >>> 10) << ((unit & (1 << 9)) >>> 6);
    let pos = offset(a[0]);
    for (const c of key) {
      if (c === 0) break;
      pos ^= c;
      const unit = a[pos];
      if (unit === undefined || (unit & 0x800000ff) >>> 0 !== c) return -1;
      pos ^= offset(unit);
      if ((unit >>> 8) & 1) return a[pos] & 0x7fffffff;
    }
    return -1;
  }

  /** spm_precompiled's transform: the replacement of `chunk`'s shortest mapped prefix. */
  transform(chunk) {
    const index = this.firstPrefixValue(UTF8.encode(chunk));
    if (index < 0) return null;
    let end = index;
    while (end < this.normalized.length && this.normalized[end] !== 0) end++;
    return new TextDecoder().decode(this.normalized.subarray(index, end));
  }

  /** One grapheme cluster normalised: replaced whole when it has under 6 UTF-8 bytes and the
   * map has it (or a prefix of it), else character by character. */
  cluster(grapheme) {
    let out = this.cache.get(grapheme);
    if (out !== undefined) return out;
    out = utf8Length(grapheme) < 6 ? this.transform(grapheme) : null;
    if (out === null) {
      out = "";
      for (const c of grapheme) out += this.transform(c) ?? c;
    }
    if (this.cache.size >= 100000) this.cache.clear();
    this.cache.set(grapheme, out);
    return out;
  }

  /** The normalised text, grapheme cluster by grapheme cluster (spm_precompiled's
   * normalize_string). Two ASCII characters are always two clusters (but CR LF): only the
   * stretches between such boundaries go through Intl.Segmenter, which is slow. */
  normalize(text) {
    let out = "";
    let start = 0;
    for (let i = 1; i <= text.length; i++) {
      const a = text.charCodeAt(i - 1);
      const b = text.charCodeAt(i); // NaN at the end
      if (i < text.length && !(a < 0x80 && b < 0x80 && !(a === 13 && b === 10))) continue;
      if (i - start === 1) out += this.cluster(text[start]);
      else for (const { segment } of this.graphemes.segment(text.slice(start, i))) {
        out += this.cluster(segment);
      }
      start = i;
    }
    return out;
  }
}

function utf8Length(text) {
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c < 0xdc00 && (text.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n += 4;
      i++;
    } else n += 3;
  }
  return n;
}

const UNK_PENALTY = 10.0; // tokenizers' K_UNK_PENALTY

/** tokenizers' Unigram model (vocab [[piece, score], ...], unk_id), Viterbi decoding. */
export class Unigram {
  constructor(model) {
    if (!Array.isArray(model.vocab) || !model.vocab.length) {
      throw new TokenizerError("Unigram model: vocab must be a non-empty [[piece, score]] list");
    }
    if (model.byte_fallback) {
      throw new TokenizerError("Unigram model with byte_fallback is not supported");
    }
    this.pieces = model.vocab.map((entry) => String(entry[0]));
    this.scores = Float64Array.from(model.vocab, (entry) => Number(entry[1]));
    this.unkId = model.unk_id ?? null;
    if (this.unkId !== null && !(this.unkId >= 0 && this.unkId < this.pieces.length)) {
      throw new TokenizerError(`Unigram model: unk_id ${this.unkId} is outside the vocab`);
    }
    this.ids = new Map(); // piece -> id (a repeated piece: its last id, as tokenizers)
    this.maxChars = 0; // the longest piece, in code points
    let min = Infinity;
    this.pieces.forEach((piece, id) => {
      this.ids.set(piece, id);
      this.maxChars = Math.max(this.maxChars, [...piece].length);
      if (this.scores[id] < min) min = this.scores[id];
    });
    this.unkScore = min - UNK_PENALTY;
  }

  tokenToId(token) {
    return this.ids.get(token);
  }

  idToToken(id) {
    return this.pieces[id];
  }

  /** The pieces of the best segmentation; consecutive unknowns fused into one string. */
  encode(text) {
    const size = text.length; // positions are UTF-16 indices, steps whole code points
    const score = new Float64Array(size + 1);
    const from = new Int32Array(size + 1).fill(-1);
    const id = new Int32Array(size + 1);
    const offer = (start, end, tokenId, tokenScore) => {
      const candidate = tokenScore + score[start];
      if (from[end] < 0 || candidate > score[end]) {
        score[end] = candidate;
        from[end] = start;
        id[end] = tokenId;
      }
    };
    for (let start = 0; start < size; ) {
      const step = text.codePointAt(start) > 0xffff ? 2 : 1;
      let single = false;
      // Every piece that is a prefix of the rest, shortest first (tokenizers' trie order).
      for (let end = start, n = 0; end < size && n < this.maxChars; n++) {
        end += text.codePointAt(end) > 0xffff ? 2 : 1;
        const tokenId = this.ids.get(text.slice(start, end));
        if (tokenId === undefined) continue;
        offer(start, end, tokenId, this.scores[tokenId]);
        if (end - start === step) single = true;
      }
      if (!single) {
        if (this.unkId === null) {
          throw new TokenizerError("Unigram model without unk_id met an unknown character");
        }
        offer(start, start + step, this.unkId, this.unkScore);
      }
      start += step;
    }
    const out = [];
    let unknown = [];
    for (let end = size; end > 0; ) {
      const start = from[end];
      const piece = text.slice(start, end);
      if (this.unkId !== null && id[end] === this.unkId) {
        unknown.push(piece);
      } else {
        if (unknown.length) out.push(unknown.reverse().join(""));
        unknown = [];
        out.push(piece);
      }
      end = start;
    }
    if (unknown.length) out.push(unknown.reverse().join(""));
    return out.reverse();
  }

  /** Token ids of one pre-token: each piece's id, `unk_id` for a fused run of unknowns. */
  tokenize(text) {
    if (!text.length) return [];
    return this.encode(text).map((piece) => this.ids.get(piece) ?? this.unkId);
  }
}

// -- regexes: Oniguruma (tokenizers' SysRegex) -> JavaScript ---------------------------------

const WORD = "\\p{L}\\p{M}\\p{N}\\p{Pc}"; // Oniguruma's Unicode \w
const BOUNDARY = `(?:(?<=[${WORD}])(?![${WORD}])|(?<![${WORD}])(?=[${WORD}]))`;
// Escapes whose meaning differs: \s is Unicode White_Space (JavaScript's \s matches U+FEFF,
// not U+0085), \d and \w are Unicode, \h is a hex digit, \A \z \Z anchor the whole text.
const IN_CLASS = { s: "\\p{White_Space}", S: "\\P{White_Space}", d: "\\p{Nd}", D: "\\P{Nd}",
  w: WORD, h: "0-9a-fA-F", b: "\\x08", a: "\\x07", e: "\\x1b" };
const OUTSIDE = { ...IN_CLASS, w: `[${WORD}]`, W: `[^${WORD}]`, h: "[0-9a-fA-F]",
  H: "[^0-9a-fA-F]", A: "^", z: "$", Z: "(?=\\n?$)", b: BOUNDARY, B: `(?!${BOUNDARY})` };
const SYNTAX = new Set("^$\\.*+?()[]{}|/");
const QUANTIFIER = /^\{(?:\d+(?:,\d*)?|,\d+)\}/;

/** A \p{name} JavaScript reads: Oniguruma takes script names alone (\p{Greek}). */
function unicodeProperty(name) {
  for (const candidate of [name, `Script=${name}`]) {
    try {
      new RegExp(`\\p{${candidate}}`, "u");
      return candidate;
    } catch {
      // not a property JavaScript knows under this name
    }
  }
  return name; // refused when the regex is built
}

/** `source` (Oniguruma, Ruby syntax as tokenizers compiles it) as a JavaScript "u" regex:
 * ^ and $ match at line starts and ends (\n only), . is anything but \n. */
export function oniguruma(source) {
  let out = "";
  let inClass = false;
  const refuse = (what) => {
    throw new TokenizerError(`regex ${JSON.stringify(source)}: ${what} is not supported`);
  };
  for (let i = 0; i < source.length; ) {
    const c = String.fromCodePoint(source.codePointAt(i));
    const next = source[i + 1];
    if (c === "\\") {
      const table = inClass ? IN_CLASS : OUTSIDE;
      if (next === undefined) refuse("a trailing backslash");
      if (next === "x" && source[i + 2] === "{") {
        const close = source.indexOf("}", i);
        if (close < 0) refuse("an unclosed \\x{");
        out += `\\u{${source.slice(i + 3, close)}}`;
        i = close + 1;
        continue;
      }
      if ((next === "p" || next === "P") && source[i + 2] === "{") {
        const close = source.indexOf("}", i);
        if (close < 0) refuse(`an unclosed \\${next}{`);
        const negate = source[i + 3] === "^"; // \p{^X}: not X
        const letter = negate === (next === "p") ? "P" : "p";
        out += `\\${letter}{${unicodeProperty(source.slice(i + (negate ? 4 : 3), close))}}`;
        i = close + 1;
        continue;
      }
      const escaped = String.fromCodePoint(source.codePointAt(i + 1));
      if (Object.hasOwn(table, escaped)) out += table[escaped];
      else if (inClass && "WHAzZB".includes(escaped)) refuse(`\\${escaped} in a class`);
      else if (/[0-9A-Za-z]/.test(escaped)) out += `\\${escaped}`; // \n \t \u.. \p{..} \1 \k<..>
      else if (SYNTAX.has(escaped) || (inClass && escaped === "-")) out += `\\${escaped}`;
      else out += `\\u{${escaped.codePointAt(0).toString(16)}}`; // \# \& \~ ...: the character
      i += 1 + escaped.length;
      continue;
    }
    if (inClass) {
      if (c === "[") refuse("a nested class or POSIX bracket");
      if (c === "&" && next === "&") refuse("class intersection &&");
      if (c === "]") inClass = false;
      out += c;
    } else if (c === "[") {
      inClass = true;
      const negated = next === "^";
      out += negated ? "[^" : "[";
      i += negated ? 2 : 1;
      if (source[i] === "]") {
        out += "\\]"; // a ] first in a class is literal
        i += 1;
      }
      continue;
    } else if (c === "^") out += "(?:^|(?<=\\n)(?!$))"; // not after a final \n
    else if (c === "$") out += "(?![^\\n])";
    else if (c === ".") out += "[^\\n]";
    else if (c === "{") {
      const quantifier = source.slice(i).match(QUANTIFIER);
      if (!quantifier) out += "\\{";
      else {
        out += quantifier[0].replace(/^\{,/, "{0,");
        i += quantifier[0].length;
        continue;
      }
    } else if (c === "}") out += "\\}";
    else if (c === "(" && next === "?") {
      const rest = source.slice(i + 2);
      if (rest.startsWith("#")) {
        i = source.indexOf(")", i) + 1 || source.length; // a comment
        continue;
      }
      if (!/^(?::|=|!|<=|<!|<[A-Za-z_])/.test(rest)) refuse(`the group (?${rest[0] ?? ""}`);
      out += c;
    } else out += c;
    i += c.length;
  }
  return out;
}

export function patternRegex(pattern, where) {
  let source;
  if (pattern && typeof pattern.Regex === "string") source = oniguruma(pattern.Regex);
  else if (pattern && typeof pattern.String === "string") {
    source = pattern.String.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
  } else throw new TokenizerError(`${where}: pattern must be {"Regex": ...} or {"String": ...}`);
  try {
    return new RegExp(source, "gu");
  } catch (err) {
    const what = JSON.stringify(pattern);
    throw new TokenizerError(`${where}: ${what} is not supported (${err.message})`);
  }
}

/** [start, end, isMatch] pieces covering `text`, matches found as Oniguruma's find_iter
 * finds them (an empty match right after a match is skipped); tokenizers' find_matches. */
export function findMatches(re, text) {
  const pieces = [];
  let prev = 0;
  let from = 0;
  let lastMatchEnd = -1;
  while (text.length && from <= text.length) {
    re.lastIndex = from;
    const m = re.exec(text);
    if (m === null) break;
    const end = m.index + m[0].length;
    if (isLowSurrogate(text, m.index) || isLowSurrogate(text, end)) {
      from = m.index + 1; // V8 tries lookarounds inside a surrogate pair; Oniguruma never does
      continue;
    }
    if (end === m.index && end === lastMatchEnd) {
      from += from < text.length && text.codePointAt(from) > 0xffff ? 2 : 1;
      continue;
    }
    if (m.index > prev) pieces.push([prev, m.index, false]);
    pieces.push([m.index, end, true]);
    prev = from = lastMatchEnd = end;
  }
  if (prev < text.length) pieces.push([prev, text.length, false]);
  return pieces;
}

function isLowSurrogate(text, i) {
  return (text.charCodeAt(i) & 0xfc00) === 0xdc00 && (text.charCodeAt(i - 1) & 0xfc00) === 0xd800;
}

/** `text` with each match of `re` replaced by `content` (tokenizers' Replace). */
export function replaceMatches(re, text, content) {
  return findMatches(re, text)
    .map(([start, end, isMatch]) => (isMatch ? content : text.slice(start, end)))
    .join("");
}
