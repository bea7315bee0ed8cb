"""Check the package boundaries that ../shared/DESIGN.md fixes.

Three rules, checked on every ``.py`` file under ``packages/*/src``:

1. **Forbidden torch modules.** No code may import or reach torch's own compiler
   (``torch._dynamo``, ``torch._inductor``, ``torch._functorch``, ``torch.compile``,
   ``torch.export``, ...). Caught forms: ``import x``, ``from x import y``,
   ``from torch import _dynamo``, ``importlib.import_module("x")``, ``__import__("x")``,
   attribute chains through any alias of a torch module (``torch._dynamo.reset``,
   ``import torch as t; t.compile(f)``), and ``getattr(torch, "_dynamo")``.
2. **Declared dependencies.** A package may import another kiln package only if its
   ``pyproject.toml`` declares it.
3. **Dependency arrows.** Imports only point down DESIGN.md's dependency column, and
   never into another package's private modules (a name starting with ``_``).

Usage: ``python tools/check_boundaries.py [ROOT]``; exits 1 and prints one line per
violation (``path:line: message``), 0 when the tree is clean.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

FORBIDDEN = (
    "torch._dynamo",
    "torch._inductor",
    "torch._functorch",
    "torch.compile",
    "torch.export",
    "torch._export",
    "torch.fx.experimental.proxy_tensor",
    "torch.fx.experimental.symbolic_shapes",
    "torch._subclasses",
    "torch.func.functionalize",
    "torch._guards",
    "torch._higher_order_ops",
)

# What each package may import (DESIGN.md's "needs" column, closed transitively: an
# arrow may skip a level, it may never point up).
ALLOWED_KILN_DEPS: dict[str, frozenset[str]] = {
    "kiln_shapes": frozenset(),
    "kiln_capture": frozenset({"kiln_shapes"}),
    "kiln_aot": frozenset({"kiln_shapes"}),
    "kiln_inductor": frozenset({"kiln_aot", "kiln_shapes"}),
    "kiln_cpp": frozenset({"kiln_inductor", "kiln_aot", "kiln_shapes"}),
    "kiln_triton": frozenset({"kiln_inductor", "kiln_aot", "kiln_shapes"}),
    "kiln": frozenset(
        {"kiln_shapes", "kiln_capture", "kiln_aot", "kiln_inductor", "kiln_cpp", "kiln_triton"}
    ),
}
KILN_IMPORT_NAMES = frozenset(ALLOWED_KILN_DEPS)


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def forbidden_prefix(dotted: str) -> str | None:
    """The forbidden module that ``dotted`` is, or lies inside; None when allowed."""
    for bad in FORBIDDEN:
        if dotted == bad or dotted.startswith(bad + "."):
            return bad
    return None


def declared_kiln_deps(pyproject: Path) -> frozenset[str]:
    """Import names of the kiln packages a pyproject declares as dependencies."""
    data = tomllib.loads(pyproject.read_text())
    names = set()
    for req in data.get("project", {}).get("dependencies", []):
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)", req)
        if m:
            imp = m.group(1).lower().replace("-", "_").replace(".", "_")
            if imp in KILN_IMPORT_NAMES:
                names.add(imp)
    return frozenset(names)


class _FileChecker(ast.NodeVisitor):
    def __init__(self, path: Path, package: str, declared: frozenset[str]) -> None:
        self.path = path
        self.package = package
        self.declared = declared
        self.violations: list[Violation] = []
        # Local names bound to a module under torch (or to importlib), by dotted name.
        self.aliases: dict[str, str] = {}

    # -- helpers ---------------------------------------------------------------
    def _report(self, node: ast.AST, message: str) -> None:
        self.violations.append(Violation(self.path, getattr(node, "lineno", 0), message))

    def _check_module(self, node: ast.AST, dotted: str, how: str) -> None:
        bad = forbidden_prefix(dotted)
        if bad is not None:
            self._report(node, f"{how} {dotted!r} reaches forbidden {bad} (DESIGN.md)")
            return
        top = dotted.split(".")[0]
        if top in KILN_IMPORT_NAMES and top != self.package:
            self._check_kiln(node, dotted)

    def _check_kiln(self, node: ast.AST, dotted: str) -> None:
        top, *rest = dotted.split(".")
        if top not in ALLOWED_KILN_DEPS[self.package]:
            self._report(
                node,
                f"{self.package} imports {top}: against the dependency arrows of DESIGN.md",
            )
        elif top not in self.declared:
            self._report(
                node,
                f"{self.package} imports {top}, which its pyproject.toml does not declare",
            )
        if any(part.startswith("_") and not part.startswith("__") for part in rest):
            self._report(node, f"{self.package} reaches into private module {dotted!r}")

    def _dotted(self, node: ast.AST) -> str | None:
        """Resolve ``a.b.c`` through the alias table to a full dotted name."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *reversed(parts)])
        return None

    # -- imports ---------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name, "import of")
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or node.module is None:
            return  # relative imports stay inside the package
        self._check_module(node, node.module, "import from")
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            # `from torch import _dynamo` / `from torch import compile`
            if forbidden_prefix(node.module) is None and forbidden_prefix(full):
                self._check_module(node, full, "import of")
            top = node.module.split(".")[0]
            if top in KILN_IMPORT_NAMES and top != self.package and alias.name.startswith("_"):
                if not alias.name.startswith("__"):
                    self._report(node, f"{self.package} reaches into private name {full!r}")
            self.aliases[alias.asname or alias.name] = full
        self.generic_visit(node)

    # -- dynamic forms ------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self._dotted(node)
        if dotted is not None and dotted.split(".")[0] in {"torch", *KILN_IMPORT_NAMES}:
            bad = forbidden_prefix(dotted)
            if bad is not None:
                self._report(node, f"attribute access {dotted!r} reaches forbidden {bad}")
                return  # one report per chain
            top = dotted.split(".")[0]
            if top in KILN_IMPORT_NAMES and top != self.package:
                self._check_kiln(node, dotted)
                return
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        target = self._dotted(func) if isinstance(func, ast.Attribute) else None
        name = func.id if isinstance(func, ast.Name) else None
        if name in self.aliases:
            target = self.aliases[name]
        first = node.args[0] if node.args else None
        literal = first.value if isinstance(first, ast.Constant) else None
        if isinstance(literal, str):
            if target == "importlib.import_module" or name == "__import__":
                self._check_module(node, literal, "dynamic import of")
        if name == "getattr" and len(node.args) >= 2:
            base = self._dotted(node.args[0]) if isinstance(node.args[0], ast.Attribute) else None
            if isinstance(node.args[0], ast.Name):
                base = self.aliases.get(node.args[0].id)
            attr = node.args[1]
            if base and isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                self._check_module(node, f"{base}.{attr.value}", "getattr of")
        self.generic_visit(node)


def check_file(path: Path, package: str, declared: frozenset[str]) -> list[Violation]:
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as e:
        return [Violation(path, e.lineno or 0, f"cannot parse: {e.msg}")]
    checker = _FileChecker(path, package, declared)
    checker.visit(tree)
    return checker.violations


def check_tree(root: Path) -> list[Violation]:
    violations: list[Violation] = []
    packages = sorted(p for p in (root / "packages").iterdir() if (p / "pyproject.toml").exists())
    for pkg_dir in packages:
        declared = declared_kiln_deps(pkg_dir / "pyproject.toml")
        for src_pkg in sorted((pkg_dir / "src").iterdir()):
            if not src_pkg.is_dir() or src_pkg.name not in ALLOWED_KILN_DEPS:
                continue
            undeclared_arrows = declared - ALLOWED_KILN_DEPS[src_pkg.name]
            for dep in sorted(undeclared_arrows):
                violations.append(
                    Violation(
                        pkg_dir / "pyproject.toml",
                        0,
                        f"{src_pkg.name} declares {dep}: against the dependency arrows",
                    )
                )
            for path in sorted(src_pkg.rglob("*.py")):
                violations.extend(check_file(path, src_pkg.name, declared))
    return violations


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    violations = check_tree(root)
    for v in violations:
        print(v)
    if violations:
        print(f"check_boundaries: {len(violations)} violation(s)")
        return 1
    print("check_boundaries: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
