"""Plant each kind of boundary violation in a copy of the package layout; each must be caught."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent
REPO = TOOLS.parent
sys.path.insert(0, str(TOOLS))

import check_boundaries  # noqa: E402


@pytest.fixture
def tree(tmp_path):
    """A copy of packages/*/pyproject.toml with one empty module per package."""
    for pyproject in (REPO / "packages").glob("*/pyproject.toml"):
        dest = tmp_path / "packages" / pyproject.parent.name
        dest.mkdir(parents=True)
        shutil.copy(pyproject, dest / "pyproject.toml")
        for src_pkg in (pyproject.parent / "src").iterdir():
            if src_pkg.is_dir() and src_pkg.name in check_boundaries.ALLOWED_KILN_DEPS:
                (dest / "src" / src_pkg.name).mkdir(parents=True)
                (dest / "src" / src_pkg.name / "__init__.py").write_text("import torch\n")
    return tmp_path


def plant(tree: Path, package: str, code: str) -> list[str]:
    dist = package.replace("_", "-")
    (tree / "packages" / dist / "src" / package / "planted.py").write_text(code)
    return [str(v) for v in check_boundaries.check_tree(tree)]


def test_the_repository_is_clean():
    result = subprocess.run(
        [sys.executable, str(TOOLS / "check_boundaries.py"), str(REPO)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout


def test_the_planted_tree_is_clean_before_planting(tree):
    assert check_boundaries.check_tree(tree) == []


FORBIDDEN_CODE = {
    "plain import": "import torch._dynamo\n",
    "import as": "import torch._inductor.config as cfg\n",
    "from import": "from torch._functorch.aot_autograd import aot_function\n",
    "from torch import private": "from torch import _dynamo\n",
    "from torch import compile": "from torch import compile as c\n",
    "proxy tensor": "from torch.fx.experimental import proxy_tensor\n",
    "make_fx": "from torch.fx.experimental.proxy_tensor import make_fx\n",
    "symbolic shapes": "import torch.fx.experimental.symbolic_shapes\n",
    "fake tensor": "from torch._subclasses.fake_tensor import FakeTensorMode\n",
    "functionalize": "from torch.func import functionalize\n",
    "guards": "import torch._guards\n",
    "hops": "import torch._higher_order_ops.cond\n",
    "export": "import torch.export\n",
    "private export": "from torch._export import x\n",
    "importlib": "import importlib\nm = importlib.import_module('torch._dynamo')\n",
    "importlib from": "from importlib import import_module\nm = import_module('torch._inductor')\n",
    "__import__": "m = __import__('torch._dynamo')\n",
    "attribute": "import torch\ntorch._dynamo.reset()\n",
    "attribute through alias": "import torch as t\nx = t._inductor\n",
    "compile call": "import torch\nf = torch.compile(lambda x: x)\n",
    "compile through submodule alias": "import torch.fx as fx\nfx.experimental.proxy_tensor.make_fx\n",
    "getattr": "import torch\nd = getattr(torch, '_dynamo')\n",
    "functionalize attribute": "import torch\ntorch.func.functionalize(f)\n",
}


@pytest.mark.parametrize("code", FORBIDDEN_CODE.values(), ids=FORBIDDEN_CODE.keys())
def test_forbidden_torch_modules_are_caught(tree, code):
    found = plant(tree, "kiln_inductor", code)
    assert len(found) >= 1, code
    assert all("planted.py:" in v for v in found)
    assert any("forbidden" in v for v in found)


ALLOWED_CODE = [
    "import torch\nimport torch.fx\nfrom torch.fx import Graph, GraphModule\n",
    "from torch.utils._pytree import tree_map\nfrom torch.utils._python_dispatch import TorchDispatchMode\n",
    "import torch._decomp\nfrom torch._ops import OpOverload\nimport torch.library\n",
    "import torch\nx = torch.func.vmap\ny = torch.ops.aten.add.Tensor\n",
    "def compile(x):\n    return x\ncompile(1)\n",
    "import re\nre.compile('x')\n",
]


@pytest.mark.parametrize("code", ALLOWED_CODE)
def test_allowed_torch_use_is_not_reported(tree, code):
    assert plant(tree, "kiln_inductor", code) == []


def test_import_against_the_arrows_is_caught(tree):
    found = plant(tree, "kiln_aot", "import kiln_inductor\n")
    assert any("against the dependency arrows" in v for v in found)


def test_import_of_an_undeclared_sibling_is_caught(tree):
    # kiln-cpp may point down to kiln-aot, but its pyproject does not declare it.
    found = plant(tree, "kiln_cpp", "from kiln_aot import trace\n")
    assert any("does not declare" in v for v in found)


def test_import_of_a_declared_sibling_is_allowed(tree):
    assert plant(tree, "kiln_cpp", "import kiln_inductor\nfrom kiln_inductor import x\n") == []


def test_reaching_into_a_private_module_is_caught(tree):
    found = plant(tree, "kiln_cpp", "from kiln_inductor._ir import Buffer\n")
    assert any("private" in v for v in found)
    found = plant(tree, "kiln_cpp", "from kiln_inductor import _secret\n")
    assert any("private" in v for v in found)
    found = plant(tree, "kiln_cpp", "import kiln_inductor\nkiln_inductor._ir.Buffer\n")
    assert any("private" in v for v in found)


def test_declaring_a_dependency_against_the_arrows_is_caught(tree):
    pyproject = tree / "packages" / "kiln-aot" / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(
            "dependencies = [", 'dependencies = [\n    "kiln-inductor>=0.1,<0.2",'
        )
    )
    found = [str(v) for v in check_boundaries.check_tree(tree)]
    assert any("declares kiln_inductor" in v for v in found)


def test_violation_names_file_and_line(tree):
    found = plant(tree, "kiln_triton", "import torch\n\n\nimport torch._dynamo\n")
    assert found and found[0].split(":")[1] == "4"


def test_command_line_exits_nonzero_on_a_violation(tree):
    plant(tree, "kiln", "import torch._dynamo\n")
    result = subprocess.run(
        [sys.executable, str(TOOLS / "check_boundaries.py"), str(tree)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "planted.py:1" in result.stdout
