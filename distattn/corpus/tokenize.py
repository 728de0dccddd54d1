"""Tokenizers. A tokenizer is any callable ``str -> list[str]``; one with a ``config()`` dict
(used to key caches) is cached by :func:`~distattn.corpus.tokenize_corpus`.
:class:`RegexTokenizer` is the default.

The default is the seed's preprocessing (000_48942d33924f2728.txt, section III.B): lowercase,
replace ``<br />`` by a space, keep runs of ``[a-z0-9']``. The seed's printed code applies
``re.sub(r"^[^a-z0-9\\s]", ...)`` with a stray ``^`` anchor, which only touches the first
character, and its class has no apostrophe (unanchored, it would split ``don't``). We follow the
code of the repository the paper names (``src/attention_core.py``), which drops the anchor and
adds the apostrophe to the class (its vocabulary holds ``don't``): the same tokens as keeping
``[a-z0-9']+`` everywhere (identical on all 100k IMDB reviews).
"""

from __future__ import annotations

import re
from typing import Protocol


class Tokenizer(Protocol):
    def __call__(self, text: str) -> list[str]: ...

    def config(self) -> dict: ...


def _subclass(tokenizer, base) -> dict:
    """A subclass that inherits ``config()`` (and overrides ``__call__``) gets its own cache key:
    the class name is added to the config (the base classes' keys are unchanged)."""
    cls = type(tokenizer)
    return {} if cls is base else {"class": f"{cls.__module__}.{cls.__qualname__}"}


_UNICODE_ONLY_SPACE = re.compile(rb"[\x1c-\x1f]")   # ASCII characters str's \s matches and bytes' \s does not


class RegexTokenizer:
    """Lowercase, strip markup strings, and keep the matches of ``pattern``.

    Parameters
    ----------
    pattern : str, optional
        Regular expression for a token, applied after lowercasing. Default ``[a-z0-9']+``, or
        ``[A-Za-z0-9']+`` with ``lowercase=False`` (the lower-case class alone would cut capitals
        out of words). A token is a whole match, also for a pattern with groups; a pattern that
        matches the empty string is refused.
    lowercase : bool, default True
    strip : tuple of str
        Substrings replaced by a space before matching (default ``("<br />",)``).
    """

    def __init__(self, pattern: str | None = None, lowercase: bool = True,
                 strip: tuple[str, ...] = ("<br />",)):
        if pattern is None:
            pattern = r"[a-z0-9']+" if lowercase else r"[A-Za-z0-9']+"
        self.pattern = pattern
        self.lowercase = lowercase
        if isinstance(strip, (str, bytes)):
            raise TypeError(f"strip={strip!r} is a string; allowed: a tuple of strings, e.g. ({strip!r},)")
        self.strip = tuple(strip)
        # ASCII text cannot contain a non-ASCII strip string: the bytes fast path skips those
        self._bstrip = tuple(x.encode("ascii") for x in self.strip if isinstance(x, str) and x.isascii())
        try:
            self._re = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"pattern={pattern!r} is not a valid regular expression: {exc}") from None
        if self._re.fullmatch("") is not None:       # an empty token at every character it did not match
            raise ValueError(f"pattern={pattern!r} matches the empty string, which would give an empty token "
                             "between every two words; allowed: a pattern that needs a character, e.g. '+' "
                             "instead of '*'")
        # a subclass that overrides __call__ (e.g. to stem) must see every text: no fast path
        fast = pattern.isascii() and type(self).__call__ is RegexTokenizer.__call__
        try:
            self._bre = re.compile(pattern.encode("ascii")) if fast else None
        except re.error:        # valid for str only (\u00e9, \N{...}, (?u)): every text takes the str path
            self._bre = None
        # re.findall gives a pattern's groups, not its matches ([a-z]+('[a-z]+)? gave '' for most words)
        self._groups = self._re.groups > 0
        # the one place a str pattern and its bytes copy differ on ASCII text: str \s also
        # matches the separators \x1c-\x1f (str.isspace()), bytes \s does not
        self._check_separators = self._bre is not None and ("\\s" in pattern or "\\S" in pattern)

    def config(self) -> dict:
        # a pattern with \s or \S tokenized text holding \x1c-\x1f differently before the bytes fast
        # path fell back to str for it: such a pattern's cache key carries the fixed path's version
        separators = {"separators": 2} if ("\\s" in self.pattern or "\\S" in self.pattern) else {}
        # a pattern with groups once gave the groups (findall): its whole-match tokens are cached apart
        matches = {"matches": "whole"} if self._groups else {}
        return {"kind": "regex", "pattern": self.pattern, "lowercase": self.lowercase,
                "strip": list(self.strip), **separators, **matches, **_subclass(self, RegexTokenizer)}

    def __repr__(self) -> str:
        return f"RegexTokenizer(pattern={self.pattern!r}, lowercase={self.lowercase}, strip={self.strip!r})"

    def __call__(self, text: str) -> list[str]:
        if self.lowercase:
            text = text.lower()
        for s in self.strip:
            text = text.replace(s, " ")
        if self._groups:
            return [m.group() for m in self._re.finditer(text)]
        return self._re.findall(text)

    def tokenize_bytes(self, raw: bytes) -> list[bytes]:
        """Tokenize UTF-8 text given as bytes; tokens come back as UTF-8 ``bytes``.

        Pure-ASCII input takes a bytes fast path (ASCII lowercasing equals Unicode lowercasing
        on ASCII text, so the tokens are the same); anything else is decoded, tokenized as
        ``str`` (Unicode lowercasing can map e.g. U+212A KELVIN SIGN to ``k``) and re-encoded.
        """
        if self._bre is not None and raw.isascii() and not (self._check_separators
                                                             and _UNICODE_ONLY_SPACE.search(raw)):
            if self.lowercase:
                raw = raw.lower()
            for s in self._bstrip:
                raw = raw.replace(s, b" ")
            if self._groups:
                return [m.group() for m in self._bre.finditer(raw)]
            return self._bre.findall(raw)
        return [t.encode("utf-8") for t in self(raw.decode("utf-8", errors="replace"))]


class WhitespaceTokenizer:
    """Split on whitespace, optionally lowercasing (for pre-tokenized text)."""

    def __init__(self, lowercase: bool = False):
        self.lowercase = lowercase

    def config(self) -> dict:
        return {"kind": "whitespace", "lowercase": self.lowercase, **_subclass(self, WhitespaceTokenizer)}

    def __call__(self, text: str) -> list[str]:
        return (text.lower() if self.lowercase else text).split()


class SeedLiteralTokenizer:
    """The seed's ``simple_tokenize`` exactly as printed (000_48942d33924f2728.txt, section III.B):
    lowercase, ``<br />`` → space, ``re.sub(r"^[^a-z0-9\\s]", " ", text)`` (the anchor makes it
    touch only the first character), then ``split()``. Punctuation stays attached (``"great!"``).

    For reproducing the seed to the letter; :class:`RegexTokenizer` (the default) implements the
    evident intent instead.
    """

    _FIRST = re.compile(r"^[^a-z0-9\s]")

    def config(self) -> dict:
        return {"kind": "seed-literal", **_subclass(self, SeedLiteralTokenizer)}

    def __repr__(self) -> str:
        return "SeedLiteralTokenizer()"

    def __call__(self, text: str) -> list[str]:
        text = text.lower().replace("<br />", " ")
        return self._FIRST.sub(" ", text).split()


# letters and digits of any script, and apostrophes; on ASCII text the same tokens as [a-z0-9']+
UNICODE_WORDS = r"(?:[^\W_]|')+"


def default_tokenizer() -> RegexTokenizer:
    """The seed's tokenizer, :class:`RegexTokenizer` (ASCII letters, digits and apostrophes): the
    evident intent of the seed's preprocessing (see :class:`SeedLiteralTokenizer` for its code to
    the letter). IMDB is tokenized with it; a corpus of one's own with :func:`unicode_tokenizer`."""
    return RegexTokenizer()


def unicode_tokenizer(lowercase: bool = True) -> RegexTokenizer:
    """Words of any script: runs of letters, digits and apostrophes (``"Café naïve, été!"`` ->
    ``['café', 'naïve', 'été']``; the ASCII default would give ``['caf', 'na', 've', 't']``). On
    ASCII text it gives the same tokens as :func:`default_tokenizer`. Scripts written without
    spaces (Chinese, Japanese, Thai) need segmenting first: join the words with spaces. The
    apostrophe is the ASCII ``'``: a typographic ``’`` splits a word (``"don’t"`` -> ``['don',
    't']``), so replace it first.

    >>> unicode_tokenizer()("Café naïve, été! Don't")
    ['café', 'naïve', 'été', "don't"]
    """
    return RegexTokenizer(pattern=UNICODE_WORDS, lowercase=lowercase)


def tokenizer_config(tokenizer) -> dict | None:
    """The config of a tokenizer, for cache keys, or None for a plain callable: its name does not
    identify what it does (every lambda is ``<lambda>``, an edited function keeps its name), so
    its output is never cached."""
    if hasattr(tokenizer, "config"):
        return tokenizer.config()
    return None


def tokenize_to_bytes(tokenizer, text) -> list[bytes]:
    """Tokens of one text (``str`` or UTF-8 ``bytes``) as UTF-8 ``bytes``, using the
    tokenizer's bytes fast path when it has one."""
    if isinstance(text, (bytes, bytearray)):
        fast = getattr(tokenizer, "tokenize_bytes", None)
        if fast is not None:
            return fast(bytes(text))
        text = bytes(text).decode("utf-8", errors="replace")
    tokens = tokenizer(text)
    if isinstance(tokens, (str, bytes)):       # would be read as one token per character
        raise TypeError(f"tokenizer {tokenizer!r} returned a {type(tokens).__name__}, not a list of tokens")
    return [t.encode("utf-8") for t in tokens]
