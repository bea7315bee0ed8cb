import shutil
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent
REPO = TOOLS.parent
sys.path.insert(0, str(TOOLS))

import check_versions  # noqa: E402


@pytest.fixture
def tree(tmp_path):
    for folder in (REPO / "packages").iterdir():
        if (folder / "pyproject.toml").exists():
            dest = tmp_path / "packages" / folder.name
            dest.mkdir(parents=True)
            shutil.copy(folder / "pyproject.toml", dest)
            shutil.copy(folder / "CHANGELOG.md", dest)
    return tmp_path


def test_the_repository_is_consistent():
    assert check_versions.check(REPO) == []


def test_a_sibling_range_the_repo_does_not_satisfy_is_caught(tree):
    pyproject = tree / "packages" / "kiln-aot" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
    (tree / "packages" / "kiln-aot" / "CHANGELOG.md").write_text("## 0.2.0\n")
    problems = check_versions.check(tree)
    assert any("kiln-inductor: requires 'kiln-aot>=0.1,<0.2'" in p for p in problems)


def test_a_missing_changelog_entry_is_caught(tree):
    (tree / "packages" / "kiln-cpp" / "CHANGELOG.md").write_text("# Changelog\n\n## 0.0.9\n")
    assert any("kiln-cpp: CHANGELOG.md has no entry" in p for p in check_versions.check(tree))


def test_disagreeing_torch_ranges_are_caught(tree):
    pyproject = tree / "packages" / "kiln-cpp" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("torch>=2.11,<2.15", "torch>=2.0"))
    assert any("disagree on the torch range" in p for p in check_versions.check(tree))
