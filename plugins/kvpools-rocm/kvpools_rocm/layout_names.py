"""The names of SGLang's ROCm KV-cache layouts (``SGLANG_AITER_KV_CACHE_LAYOUT``), shared by the layout hooks
(torch-free) and the layouts themselves (torch), so neither imports the other back."""

KV_CACHE_LAYOUT_OPTION = "rocm.kv_cache_layout"
NHD = "nhd"
VECTORIZED_5D = "vectorized_5d"
KV_CACHE_LAYOUTS = (NHD, VECTORIZED_5D)
VECTOR_BYTES = 16
"""AITER's vector: ``X = 16 // store_dtype.itemsize`` elements."""
