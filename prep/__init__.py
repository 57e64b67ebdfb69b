"""prep: turn raw text corpora into training-ready, versioned, verifiable datasets."""

__version__ = "0.1.0"
