"""Differential tests against SGLang's own sizing code (the oracle in ``../shared/oracle``).

Each module calls ``locate.require_oracle()``: without ``../shared`` it skips (a user's clone)
or fails (CI, ``KVPOOLS_REQUIRE_SHARED=1``).
"""
