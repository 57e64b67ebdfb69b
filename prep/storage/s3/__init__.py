"""A store on Amazon S3 or any S3-compatible service (see docs/s3.md), and reading input corpora
from S3. Modules: `client` (settings, errors, retries, one client per process), `reads`
(streams, ranged reads, downloads), `uploads` (conditional and multipart writes), `store`
(S3Store) and `inputs` (listing and pinned reads of corpus objects)."""

from prep.storage.s3.client import (
    DEFAULT_JOBS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    MIB,
    MIN_PART_SIZE,
    THRESHOLD_ENV,
    parse_size,
    split_url,
)
from prep.storage.s3.inputs import S3Object, hash_object, list_objects, open_object
from prep.storage.s3.s3store import (
    CONTENT_PREFIX,
    OVERWRITABLE_PREFIX,
    SHA256_METADATA,
    S3Settings,
    S3Store,
)

__all__ = [
    "CONTENT_PREFIX", "DEFAULT_JOBS", "DEFAULT_MAX_ATTEMPTS", "DEFAULT_MULTIPART_THRESHOLD", "DEFAULT_PART_SIZE",
    "MIB", "MIN_PART_SIZE", "OVERWRITABLE_PREFIX", "SHA256_METADATA", "THRESHOLD_ENV", "S3Object", "S3Settings",
    "S3Store", "hash_object", "list_objects", "open_object", "parse_size", "split_url",
]
