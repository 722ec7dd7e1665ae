"""Benchmarks of kvpools (not part of the installed package)."""
