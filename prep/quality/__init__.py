"""Quality statistics and checks: the token-length distribution of a snapshot's documents, and the
`[checks]` a build must pass before it publishes (docs/build.md, "Checks")."""
