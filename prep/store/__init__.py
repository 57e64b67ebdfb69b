"""The store layer: the key layout, objects, commit records, snapshots, refs, leases and gc."""
