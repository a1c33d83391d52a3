"""Cross-language query expansion: a non-English message with the English of the glossary's
terms it holds appended, for the retriever's search and the extractive answer's scoring.

The knowledge bases are English and the sentence model (MiniLM) reads English only, so
"Y a-t-il un essai gratuit ?" shares neither words nor meaning with "Every plan can be
tried free for 14 days". With a glossary (data/glossary.toml: common B2B software terms
in fr, de, es, it, pt, nl) the message becomes "Y a-t-il un essai gratuit ? free trial".

Matching, on words case- and accent-folded:
- a glossary form matches where its words follow each other in the message, each word the
  same or a close form (one is the other plus an ending of at most `MAX_ENDING` letters:
  "hébergées" / "hébergé"); a word shorter than `MIN_STEM` letters only as itself, accents
  included ("où" is not "ou", Dutch "per" is not "pers");
- longer forms first: the words of "essai gratuit" are not matched again as "essai" and
  "gratuit"; a form listed under several terms gives all of them;
- German and Dutch: a word that matches no form whole is searched for the forms it is
  made of ("Sicherheitszertifizierungen" → "Sicherheit" + "Zertifizierungen").

English, and a language the glossary does not have, are left as they are.
"""

from __future__ import annotations

import re
import tomllib
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

GLOSSARY = Path(__file__).parent / "data" / "glossary.toml"
TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
MIN_STEM = 4  # shorter forms are too easily part of another word: "an" / "and", "mes" / "mesa"
MAX_ENDING = 3  # letters a plural or an agreement adds: "données", "certificaciones", "Rechnungen"
COMPOUND_LANGUAGES = ("de", "nl")
MIN_PART = 5  # a compound's part shorter than this is too often a chance substring ("test", "team")


@dataclass(frozen=True)
class Form:
    words: tuple[str, ...]  # folded
    accented: tuple[str, ...]  # casefolded only
    english: str


def fold(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", text.casefold()) if not unicodedata.combining(c))


def _words(text: str) -> tuple[list[str], list[str]]:
    """(folded, casefolded) words of the text, digits kept ("2FA"), split at apostrophes and
    hyphens ("d'essai", "Zwei-Faktor")."""
    accented = TOKEN.findall(unicodedata.normalize("NFC", text.casefold()))
    return [fold(w) for w in accented], accented


def load(path: Path = GLOSSARY) -> dict[str, list[Form]]:
    """Per language, the forms, longest first (in words, then letters)."""
    out: dict[str, list[Form]] = {}
    for english, languages in tomllib.loads(path.read_text(encoding="utf-8")).items():
        for lang, listed in languages.items():
            for form in (f.strip() for f in listed.split(",")):
                folded, accented = _words(form)
                if folded:
                    out.setdefault(lang, []).append(Form(tuple(folded), tuple(accented), english))
    for forms in out.values():
        forms.sort(key=lambda f: (-len(f.words), -sum(map(len, f.words))))
    return out


FORMS = load()


def same_form(word: str, form: str, word_accented: str = "", form_accented: str = "", *, close: bool = True) -> bool:
    """The message's word is the glossary's form, or (`close`) a close form of it: see the
    module. The accented arguments matter for short words only."""
    if min(len(word), len(form)) < MIN_STEM:
        return (word_accented or word) == (form_accented or form)
    if word == form:
        return True
    if not close or word.isdigit() or form.isdigit():
        return False
    short, long_ = sorted((word, form), key=len)
    return long_.startswith(short) and len(long_) - len(short) <= MAX_ENDING


def _parts(word: str, forms: list[Form]) -> list[tuple[int, str]]:
    """(offset, English) of the single-word forms a compound word is made of, the longest
    first and not overlapping."""
    found: list[tuple[int, int, str]] = []
    for form in forms:
        if len(form.words) != 1 or len(form.words[0]) < MIN_PART or len(form.words[0]) >= len(word):
            continue
        part = form.words[0]
        start = word.find(part)
        while start >= 0:
            end = start + len(part)
            if all(end <= s or start >= e for s, e, _ in found) or any((s, e) == (start, end) for s, e, _ in found):
                found.append((start, end, form.english))
            start = word.find(part, start + 1)
    return [(s, english) for s, _, english in found]


def terms(text: str, lang: str) -> list[str]:
    """The English of the glossary terms in the text, in the order they appear, once each."""
    forms = FORMS.get(lang)
    if not forms:
        return []
    words, accented = _words(text)
    used = [False] * len(words)
    found: list[tuple[float, str]] = []
    for n in sorted({len(f.words) for f in forms}, reverse=True):
        # The forms of one length match together, a word itself before its close forms
        # ("devises" is a currency, not "devis" plus an ending).
        for exact in (True, False):
            taken: list[int] = []
            for form in (f for f in forms if len(f.words) == n):
                for i in range(len(words) - n + 1):
                    if any(used[i:i + n]):
                        continue
                    if all(same_form(words[i + k], form.words[k], accented[i + k], form.accented[k], close=not exact)
                           for k in range(n)):
                        found.append((i, form.english))
                        taken.extend(range(i, i + n))
            for i in taken:
                used[i] = True
    if lang in COMPOUND_LANGUAGES:
        for i, word in enumerate(words):
            if not used[i]:
                found += [(i + offset / 1000, english) for offset, english in _parts(word, forms)]
    present = set(words)
    out: list[str] = []
    for _, english in sorted(found, key=lambda f: f[0]):
        if english not in out and not set(_words(english)[0]) <= present:
            out.append(english)
    return out


@lru_cache(maxsize=4096)
def expand(text: str, lang: str) -> str:
    """The text, then the English of its glossary terms; unchanged in English, in a
    language the glossary lacks, or without any term. Cached: an extractive answer asks for
    the same message's expansion several times (question, follow-up context, lexical
    scores), and matching every glossary form costs more than the lookup."""
    english = terms(text, lang)
    return f"{text} {' '.join(english)}" if english else text
