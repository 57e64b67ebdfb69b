"""The moto S3 server fixtures for the storage tests."""

from tests.s3support import (  # noqa: F401
    s3_bucket,
    s3_endpoint,
    s3_request_hooks,
    s3_versioned_bucket,
)
