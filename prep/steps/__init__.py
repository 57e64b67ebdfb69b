"""Per-document steps: filters and maps over documents that run in the tokenize task, one class each."""
