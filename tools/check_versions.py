"""Check that the in-repo package versions fit together.

- every dependency of one kiln package on another names a range that the sibling's
  in-repo version satisfies;
- every package declares the same torch range (DESIGN.md: torch 2.11 through 2.14);
- every package's CHANGELOG.md has a ``## <version>`` entry for its current version.

Usage: ``python tools/check_versions.py [ROOT]``; exits 1 with one line per problem.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version


def load_packages(root: Path) -> dict[str, tuple[Path, dict]]:
    """Distribution name -> (package folder, parsed pyproject)."""
    found = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        data = tomllib.loads(pyproject.read_text())
        found[data["project"]["name"]] = (pyproject.parent, data)
    return found


def check(root: Path) -> list[str]:
    problems: list[str] = []
    packages = load_packages(root)
    versions = {name: Version(data["project"]["version"]) for name, (_, data) in packages.items()}
    torch_ranges: dict[str, str] = {}
    for name, (folder, data) in packages.items():
        for raw in data["project"].get("dependencies", []):
            req = Requirement(raw)
            if req.name == "torch":
                torch_ranges[name] = str(req.specifier)
            if req.name in versions and not req.specifier.contains(versions[req.name]):
                problems.append(
                    f"{name}: requires {raw!r} but the repo holds {req.name} {versions[req.name]}"
                )
            elif req.name.startswith("kiln") and req.name not in versions:
                problems.append(f"{name}: requires {req.name}, which is not in packages/")
            elif req.name in versions and not req.specifier:
                problems.append(f"{name}: requires {req.name} with no version range")
        changelog = folder / "CHANGELOG.md"
        version = data["project"]["version"]
        if not changelog.exists():
            problems.append(f"{name}: no CHANGELOG.md")
        elif not re.search(rf"^##\s+\[?{re.escape(version)}\]?\b", changelog.read_text(), re.M):
            problems.append(f"{name}: CHANGELOG.md has no entry '## {version}'")
    if len(set(torch_ranges.values())) > 1:
        problems.append(f"packages disagree on the torch range: {torch_ranges}")
    missing_torch = set(packages) - set(torch_ranges)
    if missing_torch:
        problems.append(f"packages without a torch requirement: {sorted(missing_torch)}")
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_versions: {len(problems)} problem(s)")
        return 1
    print(f"check_versions: {len(load_packages(root))} packages consistent")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
