"""Pure stage work on one task's inputs: read, tokenize, dedup, shard. Stages never commit."""
