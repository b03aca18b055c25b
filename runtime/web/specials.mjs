// Added tokens and post-processors of a tokenizer.json for runtime/web/tokenizer.mjs, as the
// `tokenizers` library (Rust) runs them:
//
//   const added = addedMatcher([{ content: "<mask>", id: 4, lstrip: true }]);
//   splitAdded("a <mask>b", added)       // [["a", null], [" <mask>", 4], ["b", null]]
//   buildPostProcessor(spec)([7, 8])     // RobertaProcessing: [0, 7, 8, 2]
//
// Added tokens are found leftmost-longest; `single_word` keeps a match only between non-word
// characters, `lstrip` / `rstrip` take the whitespace before / after it into the token. The
// post-processors (RobertaProcessing, BertProcessing, TemplateProcessing, ByteLevel, Sequence)
// add the special tokens of one sequence; ByteLevel's only change is to offsets.

import { TokenizerError } from "./unigram.mjs";

/** Unicode \w of the Rust regex crate (and tokenizers' Whitespace pre-tokenizer). */
export const WORD_CHAR = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}";
const STARTS_WITH_WORD = new RegExp(`^[${WORD_CHAR}]`, "u");
const ENDS_WITH_WORD = new RegExp(`[${WORD_CHAR}]$`, "u");
const SPACE_AT_END = /\p{White_Space}*$/u;
const SPACE_AT_START = /^\p{White_Space}*/u;
const ESCAPE = /[.*+?^${}()|[\]\\/]/g;

/** A matcher for the leftmost-longest of `tokens` ({content, id, single_word, lstrip,
 * rstrip}), or null for none. */
export function addedMatcher(tokens) {
  const present = tokens.filter((t) => t.content.length);
  if (!present.length) return null;
  const byContent = new Map(present.map((t) => [t.content, t]));
  const alternatives = [...byContent.keys()].sort((a, b) => b.length - a.length);
  const re = new RegExp(alternatives.map((s) => s.replace(ESCAPE, "\\$&")).join("|"), "gu");
  return { re, byContent };
}

/** Pieces of `text`, [string, id] for an added token written out, else [string, null]. */
export function splitAdded(text, matcher) {
  if (!text.length) return [];
  if (matcher === null) return [[text, null]];
  const out = [];
  let last = 0;
  for (const m of text.matchAll(matcher.re)) {
    const token = matcher.byContent.get(m[0]);
    let start = m.index;
    let stop = start + m[0].length;
    if (token.single_word) {
      const alone = start === 0 || !ENDS_WITH_WORD.test(text.slice(0, start));
      if (!alone || (stop < text.length && STARTS_WITH_WORD.test(text.slice(stop)))) continue;
    }
    if (token.lstrip) start = Math.max(text.slice(0, start).search(SPACE_AT_END), last);
    if (token.rstrip) stop += text.slice(stop).match(SPACE_AT_START)[0].length;
    if (start > last) out.push([text.slice(last, start), null]);
    out.push([text.slice(start, stop), token.id]);
    last = stop;
  }
  if (last < text.length) out.push([text.slice(last), null]);
  return out;
}

/** The id of a post-processor's [token, id] pair. */
function pairId(pair, where) {
  if (!Array.isArray(pair) || !Number.isInteger(pair[1])) {
    throw new TokenizerError(`${where}: expected a [token, id] pair, got ${JSON.stringify(pair)}`);
  }
  return pair[1];
}

/** The ids a TemplateProcessing `single` template gives for one sequence `ids`. */
function template(spec) {
  const pieces = (spec.single ?? []).map((piece) => {
    if (piece.Sequence) {
      if (piece.Sequence.id !== "A") {
        throw new TokenizerError("TemplateProcessing: a single-sequence template may only use $A");
      }
      return null; // the sequence itself
    }
    const name = piece.SpecialToken?.id;
    const special = spec.special_tokens?.[name];
    if (!special || !Array.isArray(special.ids)) {
      const what = JSON.stringify(name);
      throw new TokenizerError(`TemplateProcessing: special token ${what} has no ids`);
    }
    return special.ids;
  });
  return (ids) => pieces.flatMap((piece) => piece ?? ids);
}

/** A function ids -> ids adding the special tokens of `spec` (the file's `post_processor`)
 * around one sequence; null: none added. */
export function buildPostProcessor(spec) {
  if (spec === null || spec === undefined) return (ids) => ids;
  switch (spec.type) {
    case "RobertaProcessing":
    case "BertProcessing": {
      const [cls, sep] = [pairId(spec.cls, spec.type), pairId(spec.sep, spec.type)];
      return (ids) => [cls, ...ids, sep];
    }
    case "TemplateProcessing":
      return template(spec);
    case "ByteLevel":
      return (ids) => ids;
    case "Sequence": {
      const steps = spec.processors.map(buildPostProcessor);
      return (ids) => steps.reduce((acc, f) => f(acc), ids);
    }
    default:
      throw new TokenizerError(
        `post-processor ${JSON.stringify(spec.type)} is not supported by the web runtime; ` +
          "supported: RobertaProcessing, BertProcessing, TemplateProcessing, ByteLevel, Sequence",
      );
  }
}
