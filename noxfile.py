"""Sessions: tests (the README's test command: the suite, then the conformance suite on every built-in plugin),
tutorials, lint, typing (the defaults); plots (the sweep's tests with matplotlib), hf (the transformers
integration), docs (the site, --strict), build (sdists and wheels, installed and run from a fresh venv), bench;
deps_newest and deps_oldest (the tests that drive the dependencies' APIs, with the ``test``, ``hf`` and ``plot``
extras, against the newest and the oldest releases pyproject.toml accepts), docs_newest (the site with the newest
mkdocs stack).

Every session installs from ``constraints.txt`` so torch stays the small CPU build on these machines, except
the ``*_newest`` and ``deps_oldest`` sessions: they pin torch alone (constraints.txt's pin), the rest is left to
pyproject.toml's bounds, newest first or each ``>=`` lower bound pinned with ``==`` (:func:`lowest_requirements`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import nox

nox.needs_version = ">=2024.3.2"
nox.options.sessions = ["tests", "tutorials", "lint", "typing"]
nox.options.error_on_missing_interpreters = True

CONSTRAINTS = ("-c", "constraints.txt")
EXAMPLE_PLUGIN = "./tests/plugins/example"
TOY_ENGINE = "./tests/engines/toy"
"""A third party's engine accounting (``--accounting toy``), installed as its own distribution like the example."""
VENDOR_PLUGINS = ("./plugins/kvpools-rocm", "./plugins/kvpools-ascend")


PARALLEL = ("-n", "auto", "--dist", "worksteal")
"""pytest-xdist: one worker per core, idle workers taking queued tests from busy ones (the slowest run minutes)."""

ARCHITECTURES = ("mha", "mla", "dsa", "minimax_sparse", "mamba", "swa", "dsv4")
"""The built-in architecture plugins the plugin authors' conformance suite runs on, per platform."""
PLATFORMS = ("cpu", "ascend", "rocm")
PLATFORM_PLUGINS = ("cpu", "cuda", "ascend", "rocm")
"""The platform plugins the conformance suite proves on their own (traits, declines, builds, no torch to plan)."""
EXAMPLE_CONFORMANCE = {"example": "toy-latent.json", "example_parts": "toy-hybrid.json"}
"""The example distribution's plugins and the config each is proven on."""
ENGINES = ("sglang", "vllm", "trtllm", "toy")
"""The engines the engine conformance suite (``--kvpools-conformance-engine``) runs on: the built-ins and the toy."""
CLA_TUTORIAL = "./tutorials/architecture-plugin"
XPU_TUTORIAL = "./tutorials/platform-plugin"
"""The tutorials' distributions (docs/tutorials/): CI installs and runs them, so the pages cannot rot."""


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite, with the example plugin, the toy engine and the vendor platforms installed as separate
    distributions, then the conformance suite (``pytest --kvpools-conformance``) on every built-in architecture,
    per platform, and the engine suite (``--kvpools-conformance-engine``) on every engine."""
    session.install(*CONSTRAINTS, "-e", ".[test]", EXAMPLE_PLUGIN, TOY_ENGINE, *VENDOR_PLUGINS)
    session.run("pytest", *(session.posargs or ["-q", *PARALLEL]))
    if session.posargs:
        return  # a chosen subset of the tests: no conformance run
    quiet = ("-q", "-p", "no:cacheprovider", *PARALLEL)
    names = [f"--kvpools-conformance={name}" for name in ARCHITECTURES]
    for platform in PLATFORMS:
        session.run("pytest", *quiet, *names, f"--kvpools-conformance-platform={platform}")
    # the platform plugins on their own contract, against every installed architecture's presets
    session.run("pytest", *quiet, *[f"--kvpools-conformance={p}" for p in PLATFORM_PLUGINS])
    for name, config in EXAMPLE_CONFORMANCE.items():  # out-of-tree plugins without presets: seeded by a config
        session.run(
            "pytest",
            *quiet,
            f"--kvpools-conformance={name}",
            f"--kvpools-conformance-config={EXAMPLE_PLUGIN}/configs/{config}",
        )
    # the engine suite on every built-in engine and on the toy engine's distribution
    session.run("pytest", *quiet, *[f"--kvpools-conformance-engine={name}" for name in ENGINES])


@nox.session
def tutorials(session: nox.Session) -> None:
    """The two tutorials' distributions, installed as a reader installs them (beside the vendor platforms, in a
    venv of their own: the main suite counts exactly the distributions it installs): their own tests (the CLA
    one replays every command its page shows), then the conformance suite on them — ``cla`` on every platform,
    ``xpu`` as a platform plugin and under every built-in architecture."""
    session.install(*CONSTRAINTS, "-e", ".[test]", CLA_TUTORIAL, XPU_TUTORIAL, *VENDOR_PLUGINS)
    quiet = ("-q", "-p", "no:cacheprovider", *PARALLEL)
    for tutorial in (CLA_TUTORIAL, XPU_TUTORIAL):
        session.run("pytest", *quiet, f"{tutorial}/tests")
    cla = ("--kvpools-conformance=cla", f"--kvpools-conformance-config={CLA_TUTORIAL}/configs/cla-3b-factor3.json")
    for platform in (*PLATFORMS, "xpu"):
        session.run("pytest", *quiet, *cla, f"--kvpools-conformance-platform={platform}")
    session.run("pytest", *quiet, "--kvpools-conformance=xpu")
    names = [f"--kvpools-conformance={name}" for name in ARCHITECTURES]
    session.run("pytest", *quiet, *names, "--kvpools-conformance-platform=xpu")


@nox.session(default=False)
def plots(session: nox.Session) -> None:
    """The sweep with its optional plot extra (matplotlib): ``tests/sweep`` with the plot tests, which the
    tests session skips (``pytest.importorskip``) where matplotlib is not installed."""
    session.install(*CONSTRAINTS, "-e", ".[test,plot]")
    session.run("pytest", "-q", "-p", "no:cacheprovider", *(session.posargs or ["tests/sweep"]))


@nox.session(default=False)
def dask(session: nox.Session) -> None:
    """The sweep on an executor and on a Dask cluster started on loopback (the ``kvpools[dask]`` extra)."""
    session.install(*CONSTRAINTS, "-e", ".[test,dask]")
    session.run("pytest", "-q", "-p", "no:cacheprovider", *(session.posargs or ["tests/sweep/test_sweep_executor.py"]))


@nox.session(default=False)
def serve(session: nox.Session) -> None:
    """``kvpools serve`` with its extra: the API tests, the schema's property tests and the page in a real browser
    (``tests/serve``; the tests session skips them where the extra is not installed). The browser test needs a
    Chromium (Debian's ``chromium``, at /usr/bin/chromium or $KVPOOLS_CHROMIUM) and skips, saying so, without one."""
    session.install(*CONSTRAINTS, "-e", ".[test,serve]", "httpx2", "playwright")
    # the browser test's screenshot is the README's picture (docs/img/serve.png): regenerated on every run
    screenshot = {"KVPOOLS_SCREENSHOT": "docs/img/serve.png"}
    session.run("pytest", "-q", "-p", "no:cacheprovider", *(session.posargs or ["tests/serve"]), env=screenshot)


@nox.session
def lint(session: nox.Session) -> None:
    session.install(*CONSTRAINTS, "ruff")
    paths = ("kvpools_core", "plugins", "tests", "tutorials", "benchmarks", "examples", "docs/_hooks", "noxfile.py")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)


@nox.session
def typing(session: nox.Session) -> None:
    # the kit (kvpools_core.testing) imports pytest and hypothesis; kvpools_core.serve imports the serve extra
    session.install(*CONSTRAINTS, "-e", ".[test,serve]", "mypy")
    session.run("mypy")


@nox.session(default=False)
def hf(session: nox.Session) -> None:
    """Real models through kvpools pools: tiny random-weight transformers models generate through a
    ``KvpoolsCache`` and must match transformers' own cache token for token (extra ``hf``, ``tests/integrations``)."""
    session.install(*CONSTRAINTS, "-e", ".[test,hf]")
    session.run("pytest", "-q", "-p", "no:cacheprovider", *(session.posargs or ["tests/integrations"]))


@nox.session(default=False)
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs.yml) into site/, every warning an error: broken links and anchors, a
    missing snippet, a malformed docstring in the generated references. Builds offline: nothing is fetched."""
    session.install(*CONSTRAINTS, "-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


DEPS_EXTRAS = ("test", "hf", "plot", "dask")
"""What the dependency sessions install beside the core: the suite runs the integration and the plot tests too."""
DEPS_HEAVY = (
    "tests/core/test_config_fuzz.py",
    "tests/core/test_engine_defaults.py",
    "tests/cli/test_disaggregation.py",
)
"""Left out of the dependency sessions (they run in ``tests``): each plans or builds every preset many times over
(mutated configs, each engine's defaults, every architecture in each disaggregation role), about two minutes of the
CI's 2 cores across the two sessions, for dependency calls that the rest of :data:`DEPS_TESTS` makes too."""
DEPS_PYTEST = ("pytest", "-q", "-p", "no:cacheprovider", *PARALLEL)
DEPS_TESTS = (
    "tests/core",
    "tests/cli",
    "tests/plugins",
    "tests/testing",
    "tests/integrations",
    "tests/sweep",
    "tests/gpus",
    "tests/distributed",
    "tests/test_docs.py",
    "tests/test_docs_site.py",
    "tests/test_packaging.py",
    "tests/test_values_reference.py",
)
"""What the dependency sessions run by default: the tests that drive the dependencies' APIs (pluggy's plugin
manager, attrs values, click and rich on the command line, psutil, the plots, transformers, the docs). The numeric
and differential suites (oracle, vLLM, the architectures' sizing) drive torch alone, which every session keeps
pinned; they run in ``tests``. ``nox -s deps_newest -- tests`` runs the whole suite."""
DEPS_DEFAULT = (*(f"--ignore={path}" for path in DEPS_HEAVY), *DEPS_TESTS)


def torch_pin() -> str:
    """constraints.txt's torch pin: every dependency session keeps it (a looser torch pulls a multi-GB CUDA build)."""
    for line in Path("constraints.txt").read_text().splitlines():
        if line.startswith("torch=="):
            return line.strip()
    raise RuntimeError("constraints.txt pins no torch==: the dependency sessions need the small CPU build's pin")


def lowest_requirements(extras: Sequence[str]) -> list[str]:
    """``name==version`` for each requirement of ``[project].dependencies`` and ``extras`` (pyproject.toml) with a
    ``>=`` lower bound, torch at :func:`torch_pin`. pip has no lowest-version resolution: these go to pip as
    constraints, so what the suite runs against is what pyproject.toml claims to support."""
    import tomllib  # the nox interpreter's (Python 3.11+)
    from packaging.requirements import Requirement

    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in extras:
        texts += project["optional-dependencies"][extra]
    pins = []
    for text in texts:
        requirement = Requirement(text)
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        if requirement.name == "torch":
            pins.append(torch_pin())
        elif lower:
            pins.append(f"{requirement.name}=={lower[0]}")
    return pins


def _constraints(session: nox.Session, name: str, pins: Sequence[str]) -> str:
    path = Path(session.create_tmp()) / name
    path.write_text("".join(f"{pin}\n" for pin in pins))
    session.log(f"{name}: {', '.join(pins)}")
    return str(path)


NEWEST = ("--upgrade", "--upgrade-strategy", "eager")


@nox.session(default=False)
def deps_newest(session: nox.Session) -> None:
    """:data:`DEPS_TESTS` (with ``tests/integrations``, ``tests/sweep``'s plots and its Dask cluster) against the
    newest releases pyproject.toml accepts: torch pinned (:func:`torch_pin`), nothing else constrained."""
    constraints = _constraints(session, "newest.txt", [torch_pin()])
    extras = ",".join(DEPS_EXTRAS)
    session.install(*NEWEST, "-c", constraints, "-e", f".[{extras}]", EXAMPLE_PLUGIN, TOY_ENGINE, *VENDOR_PLUGINS)
    session.run("python", "-m", "pip", "list", "--format=freeze")
    session.run(*DEPS_PYTEST, *(session.posargs or DEPS_DEFAULT))


@nox.session(default=False)
def deps_oldest(session: nox.Session) -> None:
    """:data:`DEPS_TESTS` against the oldest releases pyproject.toml accepts: every ``>=`` lower bound of the core
    and of the ``test``, ``hf`` and ``plot`` extras pinned with ``==`` (:func:`lowest_requirements`)."""
    constraints = _constraints(session, "oldest.txt", lowest_requirements(DEPS_EXTRAS))
    extras = ",".join(DEPS_EXTRAS)
    session.install("-c", constraints, "-e", f".[{extras}]", EXAMPLE_PLUGIN, TOY_ENGINE, *VENDOR_PLUGINS)
    session.run("python", "-m", "pip", "list", "--format=freeze")
    session.run(*DEPS_PYTEST, *(session.posargs or DEPS_DEFAULT))


@nox.session(default=False)
def docs_newest(session: nox.Session) -> None:
    """The documentation site built with the newest mkdocs stack the ``docs`` extra accepts (torch pinned), every
    warning an error, into a temporary folder (site/ stays the pinned build's)."""
    constraints = _constraints(session, "newest.txt", [torch_pin()])
    session.install(*NEWEST, "-c", constraints, "-e", ".[docs]")
    session.run("python", "-m", "pip", "list", "--format=freeze")
    site = Path(session.create_tmp()) / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Allocator trace replay against SGLang's and vLLM's real allocators, kvpools and peer in the same run
    (see benchmarks/README.md): token, paged and page-API paths, checked mode, the dual SWA allocator."""
    session.run("bash", "benchmarks/run_bench.sh", *session.posargs, external=True)


RELEASED = (
    (".", "kvpools", "kvpools_core", ()),
    ("./plugins/kvpools-rocm", "kvpools-rocm", "kvpools_rocm", ("--platform", "rocm")),
    ("./plugins/kvpools-ascend", "kvpools-ascend", "kvpools_ascend", ("--platform", "ascend", "--page-size", "128")),
)
"""What this repository releases: project, distribution, the package whose ``__version__`` is its version, and how
the wheel's smoke plan selects its platform (Ascend pages by 128 for every model)."""
SMOKE_PLAN = ("plan", "llama-3.1-8b", "--memory", "60GiB")


@nox.session(default=False)
def build(session: nox.Session) -> None:
    """The sdist and wheel of kvpools and of each vendor platform into dist/ and ``twine check --strict``; then
    the wheels, installed one by one into a fresh venv, plan a bundled preset on each platform: what a user gets
    from ``pip install``, not what the checkout provides."""
    import re
    import shutil
    import sys
    from pathlib import Path

    session.install(*CONSTRAINTS, "build", "twine")
    dist = Path("dist")
    shutil.rmtree(dist, ignore_errors=True)
    wheels, versions = [], []
    for project, name, package, _ in RELEASED:
        session.run("python", "-m", "build", "--outdir", str(dist), project)  # the wheel is built from the sdist
        found = re.search(r'^__version__ = "([^"]+)"', Path(project, package, "__init__.py").read_text(), re.M)
        if found is None:
            session.error(f"{project}: {package}/__init__.py has no literal __version__")
        stem = f"{name.replace('-', '_')}-{found.group(1)}"
        if not (dist / f"{stem}.tar.gz").is_file() or not (dist / f"{stem}-py3-none-any.whl").is_file():
            session.error(f"{project}: no sdist and wheel of {package}.__version__ {found.group(1)} in dist/")
        wheels.append(str(dist / f"{stem}-py3-none-any.whl"))
        versions += [name, package, found.group(1)]
    session.run("twine", "check", "--strict", *sorted(str(path) for path in dist.iterdir()))

    venv = Path(session.create_tmp()).resolve() / "wheel-venv"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("python", "-m", "venv", str(venv))
    bin_dir = venv / ("Scripts" if sys.platform == "win32" else "bin")
    pip, python, kvpools = (str(bin_dir / tool) for tool in ("pip", "python", "kvpools"))
    for (_, _, _, platform), wheel in zip(RELEASED, wheels, strict=True):
        # the vendor wheels with --no-index: their kvpools requirement must accept the kvpools wheel just installed
        index = ["--no-index"] if platform else list(CONSTRAINTS)
        session.run(pip, "install", "--quiet", *index, wheel, external=True)
        session.run(kvpools, *SMOKE_PLAN, *platform, external=True)
    printed, core_version = session.run(kvpools, "--version", external=True, silent=True) or "", versions[2]
    if f"version {core_version}\n" not in printed:
        session.error(f"kvpools --version printed {printed.strip()!r}, not kvpools_core.__version__ {core_version}")
    check = (  # python -I: the installed wheels, never the checkout's packages in the current directory
        "import importlib, importlib.metadata as metadata, sys\n"
        "for name, package, version in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):\n"
        "    module = importlib.import_module(package)\n"
        "    assert module.__file__.startswith(sys.prefix), module.__file__\n"
        "    assert metadata.version(name) == module.__version__ == version, (name, metadata.version(name), version)\n"
        "    print(name, version, 'installed from its wheel')\n"
    )
    session.run(python, "-I", "-c", check, *versions, external=True)
