"""What changed between versions and where a document went: diff, docdiff, lineage."""
