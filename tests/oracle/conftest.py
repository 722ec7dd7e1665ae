"""Differential tests against SGLang's own sizing code (the oracle in ``../shared/oracle``)."""

from __future__ import annotations

from .locate import require_oracle

require_oracle()
