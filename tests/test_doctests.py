"""The Examples in the docstrings of qsgd and emulator run, and every public function has one."""
import doctest
import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

PACKAGES = ("qsgd", "emulator")


def _modules(pkg: str):
    root = importlib.import_module(pkg)
    yield root
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{pkg}."):
        yield importlib.import_module(info.name)


MODULES = [m.__name__ for pkg in PACKAGES for m in _modules(pkg)]


FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
# Examples that start a torch.distributed process group run in a child process: the default
# group is process-global, and a child bounded by a timeout cannot hang the suite.
CHILD_TIMEOUT_S = 300


def _starts_a_process_group(module) -> bool:
    return "init_process_group" in inspect.getsource(module)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    if _starts_a_process_group(module):
        code = ("import doctest, importlib, sys\n"
                f"r = doctest.testmod(importlib.import_module({name!r}), optionflags={FLAGS})\n"
                "sys.exit(1 if r.failed or not r.attempted else 0)\n")
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{name}: doctests still running after {CHILD_TIMEOUT_S} s:\n"
                        f"{exc.stdout or ''}{exc.stderr or ''}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return
    result = doctest.testmod(module, optionflags=FLAGS, verbose=False, report=True)
    assert result.failed == 0


@pytest.mark.parametrize("pkg", PACKAGES)
def test_every_public_function_has_an_example(pkg):
    module = importlib.import_module(pkg)
    missing = [name for name in module.__all__
               if inspect.isfunction(getattr(module, name))
               and ">>> " not in (inspect.getdoc(getattr(module, name)) or "")]
    assert not missing, f"{pkg}: public functions without an Examples section: {missing}"
