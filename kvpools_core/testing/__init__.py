"""The plugin authors' kit: prove a plugin obeys the invariants the built-ins obey, with one command.

Shipped in the wheel and registered as a pytest plugin (entry point
``pytest11: kvpools``), so installing kvpools makes it available;
``pytest -p no:kvpools`` turns it off.

* :mod:`kvpools_core.testing.registries` — an isolated registry holding only
  the plugins a test names (no entry-point autoload), a plan-and-build helper,
  a fake device memory probe.
* :mod:`kvpools_core.testing.strategies` — hypothesis strategies: serving
  options whose parallelism divides the model's heads, pages a platform's
  rules accept, kv dtypes, speculative options, request caps, budgets; model
  specs per layer kind; ``config.json`` dictionaries seeded from a plugin's
  presets.  Composable, and shrinking to readable cases.
* :mod:`kvpools_core.testing.conformance` — the checks themselves, as plain
  functions, and the command line that reproduces a failing case.
* :mod:`kvpools_core.testing.platform_conformance` — the checks a platform
  plugin passes on its own: traits that leave a page, declining other
  platforms, every installed architecture planned and built exactly on it,
  planning without torch.
* ``pytest --kvpools-conformance=NAME`` runs the conformance suite
  (:mod:`kvpools_core.testing.suite`) on the plugin ``NAME``.

Importing this package imports neither hypothesis nor pytest; the modules
that need them do.
"""

from __future__ import annotations

__all__ = ["conformance", "platform_conformance", "registries", "strategies", "suite"]
