"""Crash injection: the n-th hit of a point under one setting kills, once per marker, and a
process that outlives one setting counts afresh under the next."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from prep import faults


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The signals crash points would have sent to this process (none is sent)."""
    sent: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(sig))
    monkeypatch.setattr(faults, "_hits", Counter())
    return sent


def test_the_nth_hit_kills_once_per_marker(kills: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PREP_CRASH_AT", "stage.point:2:self")
    monkeypatch.setenv("PREP_CRASH_ONCE", str(tmp_path / "one"))
    for _ in range(4):
        faults.crash_point("stage.point")
        faults.crash_point("stage.other")
    assert kills == [signal.SIGKILL] and (tmp_path / "one").exists()


def test_a_process_that_outlived_one_setting_counts_afresh_under_the_next(kills: list[int],
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """Regression (CI on c97d7b2, test_ray near-dup chains): a Ray worker that had reached the
    point under an earlier build's setting (its marker taken by another worker, so it lived) kept
    counting, never reached `:1` again, and the next build's kill never came."""
    monkeypatch.setenv("PREP_CRASH_AT", "tokenize.after_output:1:self")
    monkeypatch.setenv("PREP_CRASH_ONCE", str(tmp_path / "earlier"))
    (tmp_path / "earlier").touch()  # another worker died for that build
    faults.crash_point("tokenize.after_output")
    assert kills == []
    monkeypatch.setenv("PREP_CRASH_ONCE", str(tmp_path / "next"))
    faults.crash_point("tokenize.after_output")
    assert kills == [signal.SIGKILL] and (tmp_path / "next").exists()
