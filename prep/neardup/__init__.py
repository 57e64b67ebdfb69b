"""Near-duplicate detection's pure compute (issue 42): settings, MinHash signatures, LSH bands, clusters.

No stores, stages or I/O: the tokenize task computes signatures with `signatures`, bucket tasks
pair documents by `lsh.band_hashes`, and `clusters` joins the pairs. docs/build.md ("Near-duplicate
removal") defines every hash these modules compute: they decide snapshot ids.
"""
