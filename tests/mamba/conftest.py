"""The oracle's process-group teardown for this folder's differential tests."""

from tests.mamba.support import oracle_process_group  # noqa: F401  (a session fixture)
