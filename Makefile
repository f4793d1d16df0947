# Two commands on a fresh machine: `make run` (the main job) and `make test` (the suite).
# Each creates .venv and installs what it needs on first use.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run test bench clean venv

# The main job needs the package only; the tests add their tools (pytest, Playwright, Triton's
# CPU interpreter: about 8 s more to install), so `make run` does not wait for them.
# --no-compile: pip would byte-compile every module of every package (torch alone has
# thousands) before the first run: 37 -> 22 s for this set-up (benchmarks/RESULTS.md). The
# main job's few processes compile what they import instead (~2 s each, every time where
# PYTHONDONTWRITEBYTECODE is set). venv's own pip (23.x) installs pyproject editables, so
# it is not upgraded first.
PIP := $(BIN)/pip install -q --no-compile

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	# torch first and exactly: the CPU wheel on disk; an open range would pull CUDA wheels.
	$(PIP) "torch==2.13.0"
	$(PIP) -e .
	touch $(STAMP)

# The suite starts hundreds of interpreters: there every module is compiled once, on every
# core, as pip would (a file that does not compile, such as torch's Python 3.12 test
# snippets, is left to Python, as pip leaves it).
$(TEST_STAMP): $(STAMP)
	$(PIP) -e ".[test]"
	$(BIN)/python -c "import compileall, sys; compileall.compile_dir(sys.prefix + '/lib', quiet=2, workers=0)"
	touch $(TEST_STAMP)

venv: $(TEST_STAMP)

run: $(STAMP)
	$(BIN)/qsgd-emu demo

# Debian's chromium (browser tests) and ip/tc (testbed tests) are installed with apt-get when
# missing and running as root (NO_APT=1: not); otherwise one line says which tests will skip.
test: $(TEST_STAMP)
	@bash scripts/test-setup.sh
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/qsgd-emu bench qsgd

clean:
	rm -rf $(VENV) build *.egg-info
