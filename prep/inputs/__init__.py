"""Finding, hashing and decoding input files."""
