"""Bridges from kvpools pools to model runtimes nobody here wrote (optional extras; imported lazily).

:mod:`kvpools_core.integrations.transformers` (extra ``kvpools[hf]``): a Hugging Face transformers ``Cache``
whose K/V live in a kvpools-built pool at allocator-given slots.
"""
