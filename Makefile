# The README's two commands: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_WS := .refloop-data/demo-workspace

.PHONY: demo test lint bench postgres histories bwrap

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,semantic]'
	touch $(STAMP)

demo: $(STAMP) bwrap
	mkdir -p $(DEMO_WS)
	$(BIN)/refloop run "Write a short report on refloop and save it as report.md" \
		--workspace $(DEMO_WS)

postgres:
	@pg_isready -h 127.0.0.1 -p 5432 -q || \
		pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start || \
		echo "PostgreSQL could not be started; DB tests will fail"

# The model's commands run in bubblewrap; refloop refuses to run them without it.
bwrap:
	@command -v bwrap >/dev/null 2>&1 || \
		(apt-get update -q && apt-get install -y -q bubblewrap) >/dev/null 2>&1 || \
		echo "could not install bubblewrap (apt-get install bubblewrap): commands will be" \
			"refused unless REFLOOP_SANDBOX=none"

test: $(STAMP) postgres bwrap
	$(BIN)/ruff check .
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python -m bench.bench_core
	$(BIN)/python -m bench.bench_review
	$(BIN)/python -m bench.bench_reflection
	$(BIN)/python -m bench.bench_sse
	$(BIN)/python -m bench.bench_code_review
	$(BIN)/python -m bench.bench_scale
	$(BIN)/python -m bench.bench_scale --no-sandbox
	$(BIN)/python -m bench.bench_sandbox
	$(BIN)/python -m bench.bench_semantic
	$(BIN)/python -m bench.bench_code_search
	$(BIN)/python -m bench.bench_mcp

histories: $(STAMP)
	REFLOOP_RECORD_HISTORIES=1 $(BIN)/pytest -q tests/workflow -k "golden or child_that_writes"
