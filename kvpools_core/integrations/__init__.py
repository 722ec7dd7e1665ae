"""Bridges from kvpools to tools and model runtimes nobody here wrote (imported lazily).

:mod:`kvpools_core.integrations.aiconfigurator`: drop-in answers for aiconfigurator's API, computed by
kvpools' plans.  :mod:`kvpools_core.integrations.transformers` (extra ``kvpools[hf]``): a Hugging Face
transformers ``Cache`` whose K/V live in a kvpools-built pool at allocator-given slots.
"""
