"""The package layers: imports run only downward, and across packages only through public faces.

Top to bottom: the application (``qsgd_emu``) and ``dashboards``; ``testbench``; ``emulator``;
``qsgd`` and ``topologies``, which know nothing of each other or of the layers above. Every
import statement counts, including the ones inside functions.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYER = {"qsgd_emu": 3, "dashboards": 3, "testbench": 2, "emulator": 1, "qsgd": 0, "topologies": 0}
#: pairs on one layer that may still not import each other
FORBIDDEN_SIDEWAYS = {("qsgd", "topologies"), ("topologies", "qsgd"), ("dashboards", "qsgd_emu")}


def _imports(path: Path):
    """(line, imported top-level package, full dotted module) of every absolute import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name.split(".")[0], a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0], node.module


def _edges():
    for pkg in LAYER:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for line, top, module in _imports(path):
                if top in LAYER and top != pkg:
                    yield pkg, top, module, f"{path.relative_to(ROOT)}:{line}"


def test_imports_run_only_downward():
    upward = [f"{where}: {pkg} imports {module}" for pkg, top, module, where in _edges()
              if LAYER[top] > LAYER[pkg] or (pkg, top) in FORBIDDEN_SIDEWAYS]
    assert not upward, "\n".join(upward)


def test_the_dashboard_uses_only_public_faces():
    private = [f"{where}: imports {module}" for pkg, top, module, where in _edges()
               if pkg == "dashboards" and module != top]
    assert not private, "\n".join(private)


@pytest.mark.parametrize("pkg", sorted(LAYER))
def test_every_package_declares_its_public_names(pkg):
    import importlib

    module = importlib.import_module(pkg)
    names = getattr(module, "__all__", None)
    assert names, f"{pkg}.__all__ is missing or empty"
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{pkg}.__all__ names what it does not define: {missing}"


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from dashboards import create_app\n")
    assert [(top, module) for _, top, module in _imports(bad)] == [("dashboards", "dashboards")]
