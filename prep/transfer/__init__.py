"""Moving snapshots onto nodes: rank shares, pull, verify."""
