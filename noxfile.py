"""Every job of the repository, as nox sessions.

    nox -s ci                 what CI runs: boundaries + versions + lint + every package's tests
    nox -s tests              each package alone in its own venv (nox -s "tests(package='kiln-aot')")
    nox -s lint               ruff check and ruff format --check
    nox -s boundaries         DESIGN.md's import rules, version ranges, and the tools' own tests
    nox -s slow               the suites marked slow (real models), kept out of CI's time budget
    nox -s fuzz               the differential fuzzer for an hour (-- --seconds N)
    nox -s demo               the main job: compile GPT-2 on the CPU, check, print the speed-up
    nox -s bench              the CPU model suite against eager and torch.compile
    nox -s report             the compile report rendered in headless Chromium

A fresh venv must get torch's CPU build: a bare torch range resolves to a multi-GB CUDA
build. ``KILN_TORCH_SPEC`` overrides the pin (``torch==2.13.0`` by default; on a machine
whose index has no such CPU wheel, point pip at one with ``PIP_EXTRA_INDEX_URL``).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES_DIR = ROOT / "packages"
TORCH_SPEC = os.environ.get("KILN_TORCH_SPEC", "torch==2.13.0")
# The transformers releases the suites were last run with: a new release once turned CI red
# with no change of kiln's (an HF test's initialization moved). Raise the bound after
# `nox -s ci` and `nox -s slow` pass with the new release (KILN_TRANSFORMERS_SPEC to try one).
TRANSFORMERS = os.environ.get("KILN_TRANSFORMERS_SPEC", "transformers>=4.40,<5.25")
# Build requirements of kiln-capture's C++ extension, installed into the venv so that
# packages build without isolation (faster, and no second resolution of torch).
BUILD_REQUIREMENTS = ["setuptools>=68", "pybind11>=2.12", "wheel"]
# Test-only requirements shared by every package's suite.
TEST_REQUIREMENTS = ["pytest>=7", "packaging", "numpy"]  # numpy: kiln-capture traces numpy code

nox.options.sessions = ["ci"]
nox.options.reuse_existing_virtualenvs = True


def _pyproject(dist: str) -> dict:
    return tomllib.loads((PACKAGES_DIR / dist / "pyproject.toml").read_text())


PACKAGES = sorted(p.name for p in PACKAGES_DIR.iterdir() if (p / "pyproject.toml").exists())


def _kiln_deps(dist: str) -> list[str]:
    """In-repo dependencies of ``dist``, transitively, dependencies before dependents."""
    order: list[str] = []

    def visit(name: str) -> None:
        for req in _pyproject(name)["project"].get("dependencies", []):
            dep = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
            if dep in PACKAGES and dep not in order:
                visit(dep)
        if name not in order:
            order.append(name)

    visit(dist)
    return order


def _install(session: nox.Session, dists: list[str]) -> None:
    """Torch first (CPU build), then the packages editable, all in one resolution."""
    session.install(TORCH_SPEC, *BUILD_REQUIREMENTS, *TEST_REQUIREMENTS)
    args: list[str] = []
    for dist in dists:
        args += ["-e", f"{PACKAGES_DIR / dist}[test]"]
    session.install("--no-build-isolation", *args)


def _run_package_tests(session: nox.Session, dist: str, marker: str, **kwargs) -> None:
    session.log(f"tests of {dist}")
    session.run(
        "python",
        "-m",
        "pytest",
        str(PACKAGES_DIR / dist / "tests"),
        "-m",
        marker,
        *session.posargs,
        env={"TRITON_INTERPRET": "1"} if dist == "kiln-triton" else {},
        **kwargs,
    )


def _all_in_order() -> list[str]:
    order: list[str] = []
    for dist in PACKAGES:
        for dep in _kiln_deps(dist):
            if dep not in order:
                order.append(dep)
    return order


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """One package in its own venv, with only what it declares."""
    deps = _kiln_deps(package)
    _install(session, deps)
    # The venv must hold exactly the kiln distributions the package declares, no more.
    session.run(
        "python",
        "-c",
        "import importlib.metadata as m, sys; "
        "got = sorted({d.metadata['Name'] for d in m.distributions() "
        "if d.metadata['Name'].startswith('kiln')}); "
        f"want = sorted({deps!r}); "
        "sys.exit(0 if got == want else f'installed {got}, declared {want}')",
    )
    _run_package_tests(session, package, "not slow")


def _lint(session: nox.Session) -> None:
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    _lint(session)


def _boundaries(session: nox.Session) -> None:
    session.run("python", "tools/check_boundaries.py")
    session.run("python", "tools/check_versions.py")
    session.run("python", "-m", "pytest", "tools/tests", "-q")


@nox.session
def boundaries(session: nox.Session) -> None:
    session.install("pytest>=7", "packaging")
    _boundaries(session)


@nox.session
def ci(session: nox.Session) -> None:
    """What `.ci/run` runs: boundaries, versions, lint, then every package's tests, one venv.

    The venv uses the interpreter that runs nox, so CI's matrix (3.11, 3.12) tests each.
    """
    session.install("ruff>=0.6", TRANSFORMERS)
    _install(session, _all_in_order())
    _boundaries(session)
    _lint(session)
    for dist in _all_in_order():
        _run_package_tests(session, dist, "not slow")


@nox.session
def slow(session: nox.Session) -> None:
    """The suites marked slow (real models from transformers), every package."""
    _install(session, _all_in_order())
    session.install(TRANSFORMERS)
    for dist in _all_in_order():
        _run_package_tests(session, dist, "slow", success_codes=[0, 5])


@nox.session
def fuzz(session: nox.Session) -> None:
    """The differential fuzzer's long run: random programs compiled with kiln against eager
    for an hour (``nox -s fuzz -- --seconds 600`` for less); failing programs are written to
    fuzz-failures/, the summary to benchmarks/results/fuzz.json. CI runs a short fixed-seed
    run (packages/kiln/tests/test_fuzz.py)."""
    _install(session, _all_in_order())
    args = session.posargs or ["--seconds", "3600"]
    session.run(
        "python", "-m", "kiln", "fuzz", "--save", "fuzz-failures",
        "--out", "benchmarks/results/fuzz.json", *args,
    )  # fmt: skip


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: compile GPT-2 on the CPU with kiln, check it against eager, time it."""
    _install(session, _all_in_order())
    session.install(TRANSFORMERS)
    session.run("python", "-m", "kiln", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The CPU model suite: eager vs torch.compile vs kiln.compile (benchmarks/models.py)."""
    _install(session, _all_in_order())
    session.install(TRANSFORMERS, "matplotlib")
    session.run("python", "benchmarks/models.py", *(session.posargs or ["--train"]))


@nox.session
def report(session: nox.Session) -> None:
    """The compile report rendered in headless Chromium (Debian's package; CI skips this)."""
    import shutil

    if not shutil.which("chromium"):
        session.run("apt-get", "install", "-y", "-q", "chromium", external=True)
    _install(session, _all_in_order())
    session.run("python", "-m", "pytest", "packages/kiln/tests/test_report.py", "-m", "slow", "-v")
