"""Fixtures shared by the whole suite: a small trained tokenizer and isolated caches."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from prep.sample import train_tokenizer
from tests.helpers import random_text

# One moto S3 server for the whole session: modules that imported these fixtures themselves got
# a server each, while per-process boto3 clients kept talking to the first one.
from tests.s3support import s3_bucket, s3_endpoint, s3_request_hooks, s3_versioned_bucket  # noqa: F401,E402

# Hypothesis: CI (CI=true) explores the same examples on every run, so it goes red only when the code
# changes, and prints how to replay a failure; local runs ("dev", Hypothesis' defaults) draw new
# examples each time and keep failures in .hypothesis/. HYPOTHESIS_PROFILE names either one instead.
# A test's own @settings (max_examples, deadline) still win over its profile's.
# Both start from Hypothesis' "default" profile, not from whichever one it loaded itself on import.
settings.register_profile("ci", settings.get_profile("default"), derandomize=True, print_blob=True, deadline=None,
                          max_examples=100, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", settings.get_profile("default"))


def _hypothesis_profile() -> str:
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return os.environ["HYPOTHESIS_PROFILE"]
    return "ci" if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no") else "dev"


settings.load_profile(_hypothesis_profile())


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE (vocab ~1000) trained in a second on varied synthetic text."""
    rng = random.Random(7)
    texts = [random_text(rng, 80) for _ in range(3000)]
    return train_tokenizer(texts, 1000, tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREP_CACHE", str(tmp_path_factory.getbasetemp() / "prep-cache"))
    monkeypatch.delenv("PREP_STORE", raising=False)
    monkeypatch.delenv("PREP_CRASH_AT", raising=False)
