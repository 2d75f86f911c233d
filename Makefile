# Two commands (README): `make demo` installs everything and runs the main job on the
# embedded default model; `make test` installs everything and runs the checks and tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WHEELS ?= $(HOME)/.cache/whale/wheels
LLAMA_VERSION := 0.3.36
MODELS ?= qwen-coder-0.5b qwen-coder-1.5b smollm2-135m
DEMO_OUT ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: install demo test lint bench clean bwrap chromium

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	command -v bwrap >/dev/null || $(MAKE) bwrap
	command -v chromium >/dev/null || $(MAKE) chromium
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# llama-cpp-python builds from source (~7.5 min on 2 cores): build the wheel once, keep it.
	ls $(WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
		$(PY) -m pip wheel -q --no-deps llama-cpp-python==$(LLAMA_VERSION) -w $(WHEELS)
	$(PY) -m pip install -q $(WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(PY) -m pip install -q -e ".[embedded,retrieval,math,train,track,dev]"
	$(VENV)/bin/whale models install $(MODELS)
	touch $@

# bubblewrap (Debian) is the second jail backend; the hostile-harness tests run on it too.
bwrap:
	if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get install -y -q bubblewrap || \
		($$SUDO apt-get update -q && $$SUDO apt-get install -y -q bubblewrap)

# Chromium (Debian), headless: the test that renders `whale report`'s HTML file runs in it.
chromium:
	if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get install -y -q chromium || \
		($$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium)

# The main job: Harness Learning's loop on the embedded models, then the before/after table.
demo: install
	$(VENV)/bin/whale adapt --task rg:basic_arithmetic --harness single_call \
		--solver qwen-coder-0.5b --proposer qwen-coder-1.5b --rounds 3 --g 4 --select ratchet \
		--dev 25 --eval 75 --feedback 8 --out $(DEMO_OUT)

lint: install
	$(VENV)/bin/ruff check whale tests benchmarks
	$(VENV)/bin/mypy whale

# After the suite, nothing it started may be alive: no process of a whale sandbox uid, no
# llama.cpp server (tests/leftovers.py exits 1 naming them).
test: lint
	$(PY) -m pytest -q
	$(PY) -m tests.leftovers

bench: install
	$(PY) -m benchmarks.runtime_overhead
	$(PY) -m benchmarks.eval_throughput
	$(PY) -m benchmarks.adapt_overhead
	$(PY) -m benchmarks.bm25_scale
	$(PY) -m benchmarks.rsft_throughput
	$(PY) -m benchmarks.serve_adapter

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
