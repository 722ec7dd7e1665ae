"""Sessions: tests (the CI command: the suite, then the conformance suite on every built-in plugin), lint, typing,
bench.

Every session installs from ``constraints.txt`` so torch stays the small CPU
build on these machines.
"""

from __future__ import annotations

import nox

nox.needs_version = ">=2024.3.2"
nox.options.sessions = ["tests", "lint", "typing"]
nox.options.error_on_missing_interpreters = True

CONSTRAINTS = ("-c", "constraints.txt")
EXAMPLE_PLUGIN = "./tests/plugins/example"
VENDOR_PLUGINS = ("./plugins/kvpools-rocm", "./plugins/kvpools-ascend")


ARCHITECTURES = ("mha", "mla", "dsa", "minimax_sparse", "mamba", "swa", "dsv4")
"""The built-in architecture plugins the plugin authors' conformance suite runs on, per platform."""
PLATFORMS = ("cpu", "ascend", "rocm")
EXAMPLE_CONFORMANCE = {"example": "toy-latent.json", "example_parts": "toy-hybrid.json"}
"""The example distribution's plugins and the config each is proven on."""


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite, with the example plugin and the vendor platforms installed as separate distributions,
    then the conformance suite (``pytest --kvpools-conformance``) on every built-in architecture, per platform."""
    session.install(*CONSTRAINTS, "-e", ".[test]", EXAMPLE_PLUGIN, *VENDOR_PLUGINS)
    session.run("pytest", *(session.posargs or ["-q"]))
    if session.posargs:
        return  # a chosen subset of the tests: no conformance run
    names = [f"--kvpools-conformance={name}" for name in ARCHITECTURES]
    for platform in PLATFORMS:
        session.run("pytest", "-q", "-p", "no:cacheprovider", *names, f"--kvpools-conformance-platform={platform}")
    for name, config in EXAMPLE_CONFORMANCE.items():  # out-of-tree plugins without presets: seeded by a config
        session.run(
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--kvpools-conformance={name}",
            f"--kvpools-conformance-config={EXAMPLE_PLUGIN}/configs/{config}",
        )


@nox.session
def lint(session: nox.Session) -> None:
    session.install(*CONSTRAINTS, "ruff")
    session.run("ruff", "check", "kvpools_core", "plugins", "tests", "benchmarks", "noxfile.py")


@nox.session
def typing(session: nox.Session) -> None:
    session.install(
        *CONSTRAINTS, "-e", ".[test]", "mypy"
    )  # the kit (kvpools_core.testing) imports pytest and hypothesis
    session.run("mypy")


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Allocator trace replay against SGLang's and vLLM's real allocators (see benchmarks/README.md)."""
    session.run("bash", "benchmarks/run_bench.sh", *session.posargs, external=True)
