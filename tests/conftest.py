"""Fixtures shared by the whole suite: a small trained tokenizer and isolated caches."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from prep.sample import train_tokenizer
from tests.helpers import random_text

# One moto S3 server for the whole session: modules that imported these fixtures themselves got
# a server each, while per-process boto3 clients kept talking to the first one.
from tests.s3support import s3_bucket, s3_endpoint, s3_request_hooks, s3_versioned_bucket  # noqa: F401,E402


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
