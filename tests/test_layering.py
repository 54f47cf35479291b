"""The oracle stands alone: reference.py (the judge) and fallback.py (judged by it) import nothing
from each other; what they share is core.py's pure math, which the oracle's proof against float64
dense attention covers. The library stands apart from its tools: no module outside
paged_attention_ext/tools/ (but __main__.py, the command's entry point) imports from tools/."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "paged_attention_ext"


def _imported_modules(path: Path) -> set:
    """Package-relative module names a file imports ('fallback', 'core', ...), at any depth."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # from . import x / from .x import y
                names.update([module] if module else [a.name for a in node.names])
            elif module.startswith("paged_attention_ext"):
                rest = module.partition(".")[2]
                names.update([rest] if rest else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            names.update(a.name.partition(".")[2] for a in node.names
                         if a.name.startswith("paged_attention_ext."))
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("judge,judged", [("reference", "fallback"), ("fallback", "reference")])
def test_judge_and_judged_do_not_import_each_other(judge, judged):
    assert judged not in _imported_modules(PACKAGE / f"{judge}.py")


def test_core_imports_neither():
    assert not _imported_modules(PACKAGE / "core.py") & {"reference", "fallback"}


LIBRARY = sorted(p for p in PACKAGE.rglob("*.py")
                 if "tools" not in p.relative_to(PACKAGE).parts and p.name != "__main__.py")


@pytest.mark.parametrize("module", LIBRARY, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_library_does_not_import_the_tools(module):
    assert "tools" not in _imported_modules(module)


def test_the_library_list_holds_the_library():
    names = {str(p.relative_to(PACKAGE)) for p in LIBRARY}
    assert {"__init__.py", "api.py", "reference.py", "fallback.py", "validation.py",
            "integrations/vllm_plugin.py"} <= names
    assert not any(name.startswith("tools") for name in names)


def test_the_check_sees_imports(tmp_path):
    # the parser must find the imports it is meant to forbid, or the tests above cannot fail
    assert "core" in _imported_modules(PACKAGE / "fallback.py")
    assert "core" in _imported_modules(PACKAGE / "reference.py")
    assert "tools" in _imported_modules(PACKAGE / "__main__.py")  # from .tools.cli import main
    for line in ("from ..tools import testing", "from paged_attention_ext.tools import cli",
                 "import paged_attention_ext.tools.backends", "from .. import tools"):
        source = tmp_path / "module.py"
        source.write_text(line + "\n")
        assert "tools" in _imported_modules(source), line
