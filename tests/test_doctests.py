"""The Examples in the docstrings of qsgd and emulator run, and every public function has one."""
import doctest
import importlib
import inspect
import pkgutil

import pytest

PACKAGES = ("qsgd", "emulator")


def _modules(pkg: str):
    root = importlib.import_module(pkg)
    yield root
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{pkg}."):
        yield importlib.import_module(info.name)


MODULES = [m.__name__ for pkg in PACKAGES for m in _modules(pkg)]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=True)
    assert result.failed == 0


@pytest.mark.parametrize("pkg", PACKAGES)
def test_every_public_function_has_an_example(pkg):
    module = importlib.import_module(pkg)
    missing = [name for name in module.__all__
               if inspect.isfunction(getattr(module, name))
               and ">>> " not in (inspect.getdoc(getattr(module, name)) or "")]
    assert not missing, f"{pkg}: public functions without an Examples section: {missing}"
