"""The document step protocol: one frozen dataclass per step, its fields the step's settings.

A step class names itself (`use`, its name in a pipeline file's `[[steps]]`), declares its
settings as its own dataclass fields (parsed from the TOML table, each error naming its key),
checks them (`check`), and decides each document (`apply`): keep it, drop it with a reason, or
change its text. It is pure: the same settings and document always give the same outcome.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class StepDocument:
    """One document as a step sees it: its id (None when the input names none) and its text."""

    id: str | None
    text: str


@dataclass(frozen=True)
class Drop:
    """A step's outcome that drops the document; `reason`, a short fixed phrase (each distinct one
    is a key of the snapshot's stats: no per-document details), is counted there."""

    reason: str


Outcome = Drop | str | None
"""What a step makes of a document: None keeps it as it is, a Drop drops it, a str is its new text."""


class SettingError(ValueError):
    """A step's setting that cannot be used: the setting's name and why."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


@dataclass(frozen=True)
class DocumentStep(ABC):
    """A per-document step: subclasses are frozen dataclasses whose fields are their settings."""

    use: ClassVar[str]

    def check(self) -> None:  # noqa: B027 -- a step whose settings need no check keeps this one
        """Raise SettingError naming a setting that is out of range or inconsistent with another."""

    @abstractmethod
    def apply(self, document: StepDocument) -> Outcome:
        """Keep (None), drop (Drop) or change (the new text) one document."""
