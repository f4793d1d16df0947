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
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and exactly: the CPU wheel on disk; an open range would pull CUDA wheels.
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e ".[test]"
	touch $(TEST_STAMP)

venv: $(TEST_STAMP)

run: $(STAMP)
	$(BIN)/qsgd-emu demo

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/qsgd-emu bench qsgd

clean:
	rm -rf $(VENV) build *.egg-info
