// A bundle's languages and generation defaults in the browser, as runtime/languages.py and
// runtime/options.py read them from config.json.
//
//   const langs = Languages.fromConfig(config.languages, tokenizer);   // null: no languages
//   langs.sourcePrefix("fr")     // [id of the source-language token]: before the tokens
//   langs.targetPrefix("de")     // [id of the target-language token]: forced first
//   forcedTargetIds(langs, target, { targetLang: "de", targetPrefix: "Die" })  // [de, Die's ids]
//   const gen = generationDefaults(config);  // {maxNewTokens, beams, lengthPenalty, forcedEos,
//                                            //  notApplied}
//
// A code's token is the code (NLLB, mBART-50) or config "token_format" with the code for {}
// (M2M-100: "__{}__"). A source is `[source language] tokens </s>` when "source_prefix" is
// true; the target language's token is forced as the first generated token (log-probability
// 0, counted in the tokens and max new tokens, as runtime/prefix.py forces it). A code the
// model lacks is refused with the list. A forced target prefix (`targetPrefix`, Python's
// `target_prefix`): text every output starts with, its target-tokenizer ids forced after the
// target language, refused (OptionsError) when empty or with symbols the target vocabulary
// lacks. Generation settings the browser's searches do not implement (no-repeat n-grams, min
// new tokens, banned ids, early_stopping other than true, renormalize, a beam size above 1 for
// the greedy loop, and forced </s> in the search graph: the loop applies it) are named in
// `notApplied`, never silently followed.

/** A per-call option this bundle cannot take (runtime/errors.py OptionsError). */
export class OptionsError extends Error {
  constructor(message) {
    super(message);
    this.name = "OptionsError";
  }
}

/** A language code the model lacks, or a language option for a model without a list. */
export class LanguageError extends OptionsError {
  constructor(message) {
    super(message);
    this.name = "LanguageError";
  }
}

export class Languages {
  constructor(codes, defaultSource, defaultTarget, sourcePrefixed) {
    this.codes = codes;
    this.defaultSource = defaultSource;
    this.defaultTarget = defaultTarget;
    this.sourcePrefixed = sourcePrefixed;
  }

  /** config.json's "languages" object checked against `tokenizer` (null when absent). */
  static fromConfig(data, tokenizer) {
    if (data === undefined || data === null) return null;
    const codes = data.codes;
    if (typeof codes !== "object" || codes === null || !Object.keys(codes).length) {
      throw new LanguageError('config.json "languages" has no "codes" object; re-export');
    }
    const spelling = data.token_format ?? "{}";
    if (typeof spelling !== "string" || spelling.split("{}").length !== 2) {
      throw new LanguageError('config.json "languages": "token_format" must contain one {}');
    }
    for (const [code, id] of Object.entries(codes)) {
      const token = spelling.replace("{}", code);
      if (!Number.isInteger(id) || tokenizer.idToToken(id) !== token) {
        throw new LanguageError(
          `config.json "languages": '${token}' is not the tokenizer's token ${id}`,
        );
      }
    }
    const langs = new Languages(
      codes,
      data.default_source ?? null,
      data.default_target ?? null,
      Boolean(data.source_prefix),
    );
    for (const [role, code] of [
      ["default_source", langs.defaultSource],
      ["default_target", langs.defaultTarget],
    ]) {
      if (code !== null && !(code in codes)) {
        throw new LanguageError(`config.json "languages": ${role} '${code}' is not a code`);
      }
    }
    return langs;
  }

  /** Refuse a code the model lacks (null/undefined: the default), naming the model's codes. */
  check(code, role) {
    if (code !== null && code !== undefined && !Object.hasOwn(this.codes, code)) {
      throw new LanguageError(
        `${role} language '${code}' is not one of this model's: ` +
          Object.keys(this.codes).join(", "),
      );
    }
  }

  /** The ids before a source's tokens: the source language's token (or none). */
  sourcePrefix(code) {
    this.check(code, "source");
    const chosen = code ?? this.defaultSource;
    return this.sourcePrefixed && chosen ? [this.codes[chosen]] : [];
  }

  /** The ids forced as the first generated tokens: the target language's token (or none). */
  targetPrefix(code) {
    this.check(code, "target");
    const chosen = code ?? this.defaultTarget;
    return chosen ? [this.codes[chosen]] : [];
  }
}

/** Refuse a language option for a bundle without languages, as runtime/languages.py does. */
export function noLanguages({ sourceLang, targetLang } = {}) {
  const named = [
    ["sourceLang", sourceLang],
    ["targetLang", targetLang],
  ].filter(([, value]) => value !== undefined && value !== null);
  if (named.length) {
    const names = named.map(([name]) => name).join(" and ");
    throw new LanguageError(`this model has no language list: drop ${names}`);
  }
}

/**
 * The ids forced as the first generated tokens, as runtime/languages.py forced_target_ids:
 * the target language's token (`languages` non-null: `targetLang` or its default), then
 * `targetPrefix` encoded by the `target` tokenizer. OptionsError for a prefix that is not a
 * non-empty text, or has symbols the target vocabulary lacks (they would be forced as <unk>).
 */
export function forcedTargetIds(languages, target, { targetLang, targetPrefix } = {}) {
  if (targetPrefix !== undefined && targetPrefix !== null) {
    if (typeof targetPrefix !== "string" || !targetPrefix.trim()) {
      const text = typeof targetPrefix === "string";
      const got = text ? `'${targetPrefix}'` : JSON.stringify(targetPrefix);
      throw new OptionsError(`targetPrefix must be a non-empty text, got ${got}`);
    }
  }
  const ids = languages ? languages.targetPrefix(targetLang) : [];
  if (!targetPrefix) return ids;
  const encoded = target.encode(targetPrefix);
  if (encoded.includes(target.unkId)) {
    throw new OptionsError(
      `targetPrefix '${targetPrefix}' has symbols the model's target vocabulary lacks ` +
        "(they would be forced as <unk>): rewrite it in its symbols",
    );
  }
  return [...ids, ...encoded];
}

// runtime/options.py BUILTIN_DEFAULTS of the settings the browser does not implement.
const NOT_IMPLEMENTED = {
  early_stopping: true,
  no_repeat_ngram_size: 0,
  min_new_tokens: 0,
  bad_words_ids: [],
  renormalize: false,
};

/**
 * The bundle's generation defaults (config.json "generation", docs/generation.md) the
 * browser applies: maxNewTokens (null: max_len), beams and lengthPenalty (the search graph's
 * defaults), forcedEos (generate() emits </s> at the budget's last step, as runtime/rules.py),
 * and `notApplied`: "key=value" of each recorded setting it does not implement.
 */
export function generationDefaults(config) {
  const gen = config.generation ?? {};
  const notApplied = [];
  for (const [key, builtin] of Object.entries(NOT_IMPLEMENTED)) {
    if (key in gen && JSON.stringify(gen[key]) !== JSON.stringify(builtin)) {
      notApplied.push(`${key}=${JSON.stringify(gen[key])}`);
    }
  }
  if (gen.forced_eos === true) {
    notApplied.push("forced_eos=true in generateInGraph (generate() applies it)");
  }
  if ((gen.beam_size ?? 1) > 1) {
    notApplied.push(`beam_size=${gen.beam_size} in generate() (greedy; generateInGraph applies it)`);
  }
  return {
    maxNewTokens: gen.max_new_tokens ?? null,
    beams: gen.beam_size ?? 1,
    lengthPenalty: gen.length_penalty ?? 1.0,
    forcedEos: gen.forced_eos === true,
    notApplied,
  };
}
