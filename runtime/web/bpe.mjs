// What runtime/web/tokenizer.mjs needs for byte-pair-encoding tokenizers, ported from the
// `tokenizers` library (Rust) that runtime/tokenizer.py runs:
//
//   new BPE(data.model).tokenize("Ġhello")          // ids of one pre-token (merges by rank)
//   byteLevelPreTokenizer(spec)(" héllo 123")     // GPT-2's split, each byte as one character
//   byteLevelDecoder(["Ġh", "Ã©llo"])             // [" héllo"]: characters back to UTF-8 bytes
//   byteFallbackDecoder(["<0xC3>", "<0xA9>"])     // ["é"]: SentencePiece byte pieces
//
// The BPE model reads both serialisations of `merges` ("a b" strings and ["a", "b"] pairs),
// `unk_token` (fused or not: `fuse_unk`), `continuing_subword_prefix`, `end_of_word_suffix`,
// `byte_fallback` (<0xNN> tokens for a character the vocab lacks) and `ignore_merges`. A word
// is split into characters, then the pair of lowest merge rank (leftmost among equals) is
// merged until none is left, as the crate's Word::merge_all does; results are cached per word.
// BPE dropout samples merges at random, so a file with a non-null `dropout` is refused.
// Byte-level files (GPT-2, RoBERTa, BART) map every UTF-8 byte to a printable character before
// the model (the crate's bytes_char table) and back in the decoder.

import { TokenizerError, findMatches, oniguruma } from "./unigram.mjs";

const UTF8 = new TextEncoder();
// Rust's String::from_utf8_lossy / from_utf8 keep a leading U+FEFF; TextDecoder drops it unless
// told to ignore the BOM.
const UTF8_LOSSY = new TextDecoder("utf-8", { ignoreBOM: true });
const UTF8_STRICT = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const CACHE_SIZE = 10000; // words kept per model (the crate's default capacity)

/** A binary min-heap of pending merges ordered by (rank, position), as the crate's queue. */
class MergeQueue {
  constructor() {
    this.items = []; // [rank, pos, newId]
  }

  get size() {
    return this.items.length;
  }

  before(a, b) {
    return a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]);
  }

  push(item) {
    const items = this.items;
    let i = items.push(item) - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!this.before(items[i], items[parent])) break;
      [items[i], items[parent]] = [items[parent], items[i]];
      i = parent;
    }
  }

  pop() {
    const items = this.items;
    const top = items[0];
    const last = items.pop();
    if (items.length) {
      items[0] = last;
      for (let i = 0; ; ) {
        const [l, r] = [2 * i + 1, 2 * i + 2];
        let best = i;
        if (l < items.length && this.before(items[l], items[best])) best = l;
        if (r < items.length && this.before(items[r], items[best])) best = r;
        if (best === i) break;
        [items[i], items[best]] = [items[best], items[i]];
        i = best;
      }
    }
    return top;
  }
}

const isString = (s) => typeof s === "string";

/** The merges of a BPE file as [left, right] pairs, in rank order. */
function mergePairs(merges) {
  if (!Array.isArray(merges)) throw new TokenizerError("BPE model: merges must be a list");
  const pairs = [];
  for (const entry of merges) {
    if (typeof entry === "string") {
      if (entry.startsWith("#version")) continue; // a merges.txt header, skipped as the crate does
      const parts = entry.split(" ");
      if (parts.length !== 2) {
        const what = `merge ${pairs.length + 1} ${JSON.stringify(entry)}`;
        throw new TokenizerError(`BPE model: ${what} is not "a b"`);
      }
      pairs.push(parts);
    } else if (Array.isArray(entry) && entry.length === 2 && entry.every(isString)) {
      pairs.push(entry);
    } else {
      const what = JSON.stringify(entry);
      throw new TokenizerError(`BPE model: merge ${what} is not "a b" or ["a", "b"]`);
    }
  }
  return pairs;
}

/** tokenizers' BPE model (vocab {token: id}, merges), without dropout. */
export class BPE {
  constructor(model) {
    if (model.dropout !== null && model.dropout !== undefined) {
      throw new TokenizerError(
        `BPE model with dropout ${model.dropout} is not supported (it merges at random); ` +
          'save the tokenizer with "dropout": null',
      );
    }
    if (!model.vocab || typeof model.vocab !== "object" || Array.isArray(model.vocab)) {
      throw new TokenizerError("BPE model: vocab must be a {token: id} object");
    }
    this.ids = new Map(Object.entries(model.vocab));
    this.tokens = [];
    for (const [token, id] of this.ids) this.tokens[id] = token;
    this.unkToken = model.unk_token ?? null;
    this.prefix = model.continuing_subword_prefix ?? null;
    this.suffix = model.end_of_word_suffix ?? null;
    this.fuseUnk = Boolean(model.fuse_unk);
    this.byteFallback = Boolean(model.byte_fallback);
    this.ignoreMerges = Boolean(model.ignore_merges);
    this.unkId = this.unkToken === null ? null : (this.ids.get(this.unkToken) ?? null);
    this.width = this.tokens.length + 1; // pair key = left * width + right
    this.merges = new Map(); // pair key -> [rank, merged id]; a repeated pair keeps its last rank
    mergePairs(model.merges ?? []).forEach(([left, right], rank) => {
      const unprefixed = this.prefix !== null && right.startsWith(this.prefix);
      const merged = left + (unprefixed ? right.slice(this.prefix.length) : right);
      const ids = [left, right, merged].map((token) => {
        const id = this.ids.get(token);
        if (id === undefined) {
          const what = JSON.stringify(token);
          throw new TokenizerError(`BPE model: merge token ${what} is not in the vocab`);
        }
        return id;
      });
      this.merges.set(ids[0] * this.width + ids[1], [rank, ids[2]]);
    });
    this.cache = new Map(); // word -> ids
  }

  tokenToId(token) {
    return this.ids.get(token);
  }

  idToToken(id) {
    return this.tokens[id];
  }

  /** The symbols of `word` before any merge: one per character (with the prefix / suffix),
   * <0xNN> byte tokens for a character the vocab lacks (byte_fallback), else `unk_token`
   * (consecutive ones fused when fuse_unk), or nothing without an unk_token. */
  symbols(word) {
    const chars = Array.from(word);
    const out = [];
    let unk = null; // a pending unknown, emitted before the next known symbol
    chars.forEach((char, i) => {
      let s = char;
      if (i > 0 && this.prefix !== null) s = this.prefix + s;
      if (i === chars.length - 1 && this.suffix !== null) s += this.suffix;
      const id = this.ids.get(s);
      if (id !== undefined) {
        if (unk !== null) out.push(unk);
        unk = null;
        out.push(id);
        return;
      }
      if (this.byteFallback) {
        const bytes = Array.from(UTF8.encode(s), (b) => this.ids.get(byteToken(b)));
        if (bytes.every((b) => b !== undefined)) {
          out.push(...bytes); // before a pending unknown, as the crate does
          return;
        }
      }
      if (this.unkToken === null) return;
      if (this.unkId === null) {
        const what = JSON.stringify(this.unkToken);
        throw new TokenizerError(`BPE model: unk_token ${what} is not in the vocab`);
      }
      if (unk !== null && !this.fuseUnk) out.push(unk);
      unk = this.unkId;
    });
    if (unk !== null) out.push(unk);
    return out;
  }

  /** `ids` (a word's symbols) merged in rank order, as the crate's Word::merge_all merges. */
  mergeAll(ids) {
    const n = ids.length;
    const prev = Int32Array.from({ length: n }, (_, i) => i - 1);
    const next = Int32Array.from({ length: n }, (_, i) => (i + 1 < n ? i + 1 : -1));
    const alive = new Uint8Array(n).fill(1);
    const queue = new MergeQueue();
    const offer = (pos, right) => {
      const merge = this.merges.get(ids[pos] * this.width + ids[right]);
      if (merge !== undefined) queue.push([merge[0], pos, merge[1]]);
    };
    for (let i = 0; i + 1 < n; i++) offer(i, i + 1);
    while (queue.size) {
      const [, pos, newId] = queue.pop();
      const right = next[pos];
      if (!alive[pos] || right < 0) continue;
      const merge = this.merges.get(ids[pos] * this.width + ids[right]);
      if (merge === undefined || merge[1] !== newId) continue; // an outdated entry
      ids[pos] = newId;
      alive[right] = 0;
      next[pos] = next[right];
      if (next[right] >= 0) prev[next[right]] = pos;
      if (prev[pos] >= 0) offer(prev[pos], pos);
      if (next[pos] >= 0) offer(pos, next[pos]);
    }
    return ids.filter((_, i) => alive[i]);
  }

  /** Token ids of one pre-token. */
  tokenize(word) {
    if (!word.length) return [];
    if (this.ignoreMerges && this.ids.has(word)) return [this.ids.get(word)];
    let ids = this.cache.get(word);
    if (ids === undefined) {
      ids = this.mergeAll(this.symbols(word));
      if (this.cache.size >= CACHE_SIZE) this.cache.clear();
      this.cache.set(word, ids);
    }
    return ids.slice();
  }
}

function byteToken(byte) {
  return `<0x${byte.toString(16).toUpperCase().padStart(2, "0")}>`;
}

// -- byte-level pieces (GPT-2, RoBERTa, BART) ------------------------------------------------

/** The crate's bytes_char: printable bytes stand for themselves, the others for 256 + n. */
const BYTE_CHARS = (() => {
  const printable = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  const chars = [];
  let n = 0;
  for (let b = 0; b < 256; b++) chars[b] = String.fromCodePoint(printable(b) ? b : 256 + n++);
  return chars;
})();
const CHAR_BYTES = new Map(BYTE_CHARS.map((c, b) => [c, b]));
// GPT-2's split pattern, as the crate's ByteLevel compiles it (Oniguruma syntax).
const GPT2_SPLIT = new RegExp(
  oniguruma("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"),
  "gu",
);

function byteChars(text) {
  let out = "";
  for (const b of UTF8.encode(text)) out += BYTE_CHARS[b];
  return out;
}

/** The ByteLevel pre-tokenizer: a space prepended (add_prefix_space) unless the piece starts
 * with one, GPT-2's split (use_regex), then each UTF-8 byte written as its character. */
export function byteLevelPreTokenizer(spec) {
  const addPrefixSpace = spec.add_prefix_space ?? true;
  const useRegex = spec.use_regex ?? true;
  return (s) => {
    const text = addPrefixSpace && s.length && !s.startsWith(" ") ? ` ${s}` : s;
    const pieces = useRegex ? findMatches(GPT2_SPLIT, text) : [[0, text.length]];
    return pieces.filter(([a, b]) => b > a).map(([a, b]) => byteChars(text.slice(a, b)));
  };
}

/** The ByteLevel decoder: each token's characters back to bytes (a token with a character
 * outside the table: its own UTF-8), all of them read as UTF-8 with U+FFFD for bad bytes. */
export function byteLevelDecoder(tokens) {
  const bytes = [];
  for (const token of tokens) {
    const own = Array.from(token, (c) => CHAR_BYTES.get(c));
    bytes.push(...(own.every((b) => b !== undefined) ? own : UTF8.encode(token)));
  }
  return [UTF8_LOSSY.decode(Uint8Array.from(bytes))];
}

// A byte piece: the crate reads the two characters after "<0x" in base 16 (a "+" included).
const BYTE_PIECE = /^<0x([+0-9A-Fa-f][0-9A-Fa-f])>$/;

/** The ByteFallback decoder: runs of <0xNN> tokens become their UTF-8 text, or one U+FFFD per
 * byte when the run is not valid UTF-8; other tokens pass through. */
export function byteFallbackDecoder(tokens) {
  const out = [];
  let run = [];
  const flush = () => {
    if (!run.length) return;
    try {
      out.push(UTF8_STRICT.decode(Uint8Array.from(run)));
    } catch {
      for (let i = 0; i < run.length; i++) out.push("\ufffd");
    }
    run = [];
  };
  for (const token of tokens) {
    const m = BYTE_PIECE.exec(token);
    if (m) run.push(Number.parseInt(m[1], 16));
    else {
      flush();
      out.push(token);
    }
  }
  flush();
  return out;
}
