"""A multilingual model's languages: the codes its tokenizer has, where the source language
goes, and the defaults, as config.json's "languages" object records them (docs/bundle.md).

    langs = Languages.from_config(data["languages"], tokenizer)     # None: no languages
    langs.source_prefix_ids("eng_Latn")     # [id of eng_Latn]: what goes before the tokens
    langs.target_prefix("fra_Latn")         # (id of fra_Latn,): forced as the first token
    options = langs.resolve(options)        # the defaults filled in, unknown codes refused
    langs = with_default_target(langs, "deu_Latn")  # another default target (serve --target-lang)

A code's token is the code itself (NLLB, mBART-50) or "token_format" with the code for {}
(M2M-100: `__{}__`, code `fr`, token `__fr__`). A source is `[source language] tokens </s>`
(NLLB's non-legacy layout) when "source_prefix" is true; the target language is forced as
the first generated token (runtime/prefix.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .config import ModelConfig
from .errors import BundleError, OptionsError
from .search import GenerationOptions
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class Languages:
    """Language codes -> token ids, and the defaults."""

    codes: dict[str, int]
    default_source: str | None
    default_target: str | None
    source_prefix: bool  # sources start with the source language's token

    @classmethod
    def from_config(cls, data: Any, tokenizer: Tokenizer) -> Languages | None:
        """The "languages" object of config.json (None when absent), checked against the
        tokenizer: each code is the token of its id. BundleError naming the problem."""
        if data is None:
            return None
        codes = data.get("codes") if isinstance(data, dict) else None
        if not isinstance(codes, dict) or not codes:
            raise BundleError('config.json "languages" has no "codes" object; re-export')
        spelling = data.get("token_format", "{}")
        if not isinstance(spelling, str) or spelling.count("{}") != 1:
            raise BundleError('config.json "languages": "token_format" must contain one {}')
        for code, i in codes.items():
            token = spelling.replace("{}", str(code))
            if not isinstance(i, int) or tokenizer.hf.id_to_token(i) != token:
                raise BundleError(
                    f'config.json "languages": {token!r} is not the tokenizer\'s token {i!r}'
                )
        langs = cls(
            dict(codes),
            data.get("default_source"),
            data.get("default_target"),
            bool(data.get("source_prefix")),
        )
        for role in ("default_source", "default_target"):
            code = getattr(langs, role)
            if code is not None and code not in codes:
                raise BundleError(f'config.json "languages": {role} {code!r} is not a code')
        return langs

    def check(self, code: str | None, role: str) -> None:
        """OptionsError (one line, with the list) unless `code` is None or a known code."""
        if code is not None and code not in self.codes:
            raise OptionsError(
                f"{role} language {code!r} is not one of this model's: {', '.join(self.codes)}"
            )

    def resolve(self, options: GenerationOptions) -> GenerationOptions:
        """`options` with the default source and target languages where unset; OptionsError
        for a code the model does not have."""
        self.check(options.source_lang, "source")
        self.check(options.target_lang, "target")
        return replace(
            options,
            source_lang=options.source_lang or self.default_source,
            target_lang=options.target_lang or self.default_target,
        )

    def source_prefix_ids(self, code: str | None) -> list[int]:
        """The ids that go before a source's tokens: the source language's token."""
        self.check(code, "source")
        code = code or self.default_source
        return [self.codes[code]] if self.source_prefix and code else []

    def target_prefix(self, code: str | None) -> tuple[int, ...]:
        """The ids forced as the first generated tokens: the target language's token."""
        self.check(code, "target")
        code = code or self.default_target
        return (self.codes[code],) if code else ()


def no_languages(options: GenerationOptions) -> None:
    """OptionsError when `options` name a language for a model without a language list."""
    named = [name for name in ("source_lang", "target_lang") if getattr(options, name)]
    if named:
        flags = " and ".join(f"--{n.replace('_lang', '')}-lang ({n})" for n in named)
        raise OptionsError(f"this model has no language list: drop {flags}")


def with_default_target(languages: Languages | None, code: str) -> Languages:
    """`languages` with `code` as the default target (`edgeseq serve --target-lang`, the bundle's
    own from `edgeseq export --target-lang`); OptionsError for a code the model does not have
    (with the list) or a model without a language list."""
    if languages is None:
        no_languages(GenerationOptions(target_lang=code))
    assert languages is not None
    languages.check(code, "target")
    return replace(languages, default_target=code)


def source_start(
    config: ModelConfig, languages: Languages | None, code: str | None = None
) -> list[int]:
    """The ids before a source's tokens: `<s>` when config.source_bos (BART), then the
    source language's token of a model with a language list (`code`, else its default)."""
    bos = [config.bos_id] if config.source_bos else []
    return bos + (languages.source_prefix_ids(code) if languages is not None else [])


def forced_target_ids(
    languages: Languages | None, tokenizer: Tokenizer, options: GenerationOptions
) -> list[int]:
    """The ids forced as the first generated tokens: the target language's token (a model
    with a language list), then `options.target_prefix` encoded by the target `tokenizer`;
    OptionsError when that text has symbols the vocabulary lacks."""
    ids = list(languages.target_prefix(options.target_lang)) if languages else []
    if options.target_prefix:
        encoded = tokenizer.encode(options.target_prefix)
        if tokenizer.unk_id in encoded:
            raise OptionsError(
                f"target_prefix {options.target_prefix!r} has symbols the model's target "
                "vocabulary lacks (they would be forced as <unk>): rewrite it in its symbols"
            )
        ids += encoded
    return ids
