"""Read a snapshot in training: deterministic token windows and documents, mixtures, exact
resumption on any world size (docs/data.md). `prep.data.torch` holds the torch adapter."""

from prep.data.reader import Reader

__all__ = ["Reader"]
