"""The document step protocol: one frozen dataclass per step, its fields the step's settings.

A step class names itself (`use`, its name in a pipeline file's `[[steps]]`), declares its
settings as its own dataclass fields (parsed from the TOML table, each error naming its key),
checks them (`check`), and decides each document (`apply`): keep it, drop it with a reason, or
change its text. It is pure: the same settings and document always give the same outcome.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


@dataclass(frozen=True)
class StepDocument:
    """One document as a step sees it: its id (None when the input names none), its text, the
    input file it was read from (relative, as manifests name it) and its row in its part; `line`
    is its 1-based line (JSON Lines) or row in that file."""

    id: str | None
    text: str
    source: str = ""
    row: int = 0
    metadata: Mapping[str, object] = field(default_factory=dict)
    """Its metadata: the input's metadata_fields it has, and the keys earlier steps set."""
    lines: Callable[[int], int] | None = field(default=None, compare=False, repr=False)
    """The file's line of a row of the part: counting the lines of earlier parts reads the file up
    to the part, once per task, so it is asked only when a step reads `line`."""

    @property
    def line(self) -> int:
        """The document's 1-based line (JSON Lines) or row in its input file."""
        return self.lines(self.row) if self.lines is not None else self.row + 1


@dataclass(frozen=True)
class Drop:
    """A step's outcome that drops the document; `reason`, a short fixed phrase (each distinct one
    is a key of the snapshot's stats: no per-document details), is counted there; `detail`, what
    about this document made the step drop it (the benchmark item it shares an n-gram with, say),
    is only kept with the dropped document, for `prep trace` and `prep show --dropped`."""

    reason: str
    detail: str = ""


@dataclass(frozen=True)
class Change:
    """A step's outcome that keeps the document with a new text (None: the same) and sets metadata
    keys (each one the step declares in `metadata_keys`, to a value JSON can spell)."""

    text: str | None = None
    metadata: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, text: str | None = None, **metadata: object) -> Change:
        """A change setting these metadata keys (sorted: the same change is the same value)."""
        return cls(text, tuple(sorted(metadata.items())))


Outcome = Drop | str | Change | None
"""What a step makes of a document: None keeps it as it is, a Drop drops it, a str is its new text,
a Change its new text and metadata."""


class BatchTexts(Protocol):
    """A batch of documents' texts: document i is `blob[offsets[i]:offsets[i + 1]]`, valid UTF-8."""

    @property
    def blob(self) -> bytes: ...
    @property
    def offsets(self) -> npt.NDArray[np.int64]: ...


class SettingError(ValueError):
    """A step's setting that cannot be used: the setting's name and why."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


@dataclass(frozen=True)
class DocumentStep(ABC):
    """A per-document step: subclasses are frozen dataclasses whose fields are their settings."""

    use: ClassVar[str]

    @property
    def name(self) -> str:
        """How counts, messages and the resolved config name the step: its `use`."""
        return self.use

    def settings(self) -> dict[str, object]:
        """The step's settings by name, as the resolved config and its task keys record them: a
        tuple as a list, a float as its shortest decimal string (`repr`: "0.65"; canonical JSON
        holds no floats)."""
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        return {name: list(value) if isinstance(value, tuple) else repr(value) if isinstance(value, float) else value
                for name, value in values.items()}

    def code_identity(self) -> str:
        """What identifies the step's code in task keys: the SHA-256 of its class's module source."""
        return _module_sha256(type(self).__module__)

    def resolve(self, base_dir: Path | None) -> DocumentStep:
        """The step with what its settings name read where the pipeline is (`base_dir`: its
        folder), as fields marked `metadata={"derived": True}` (no pipeline sets those); this one."""
        return self

    def require_at_least(self, keys: Iterable[str], low: int) -> None:
        """SettingError naming the first setting of `keys` that is set and below `low`."""
        for key in keys:
            value = getattr(self, key)
            if value is not None and value < low:
                raise SettingError(key, f"must be >= {low}, got {value}")

    def require_fractions(self, keys: Iterable[str]) -> None:
        """SettingError naming the first setting of `keys` outside [0, 1] (NaN included)."""
        for key in keys:
            value = getattr(self, key)
            if not 0 <= value <= 1:
                raise SettingError(key, f"must be within [0, 1], got {value}")

    def require_ordered(self, units: Iterable[str]) -> None:
        """SettingError on `min_<unit>` when it and `max_<unit>` are both set and the minimum is larger."""
        for unit in units:
            low, high = getattr(self, f"min_{unit}"), getattr(self, f"max_{unit}")
            if low is not None and high is not None and low > high:
                raise SettingError(f"min_{unit}", f"must be <= max_{unit} ({high}), got {low}")

    def metadata_keys(self) -> tuple[str, ...]:
        """The metadata keys the step sets on the documents it keeps (with `Change`): each is a
        field of the build's per-document metadata in every format."""
        return ()

    def check(self) -> None:  # noqa: B027 -- a step whose settings need no check keeps this one
        """Raise SettingError naming a setting that is out of range or inconsistent with another."""

    def apply_batch(self, batch: BatchTexts) -> Sequence[Outcome] | None:
        """Every document's outcome at once (the same as `apply`'s), where the step has a faster way
        over the batch's buffer (numpy, imported here, never at module import); None: ask `apply`."""
        return None

    @abstractmethod
    def apply(self, document: StepDocument) -> Outcome:
        """Keep (None), drop (Drop) or change (the new text, or a Change) one document."""


@functools.cache
def _module_sha256(module: str) -> str:
    """SHA-256 of a module's source file."""
    return hashlib.sha256(Path(str(sys.modules[module].__file__)).read_bytes()).hexdigest()
