# The README's two commands.  Each creates .venv and installs what it needs on first use.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# torch 2.13.0 is a local CPU wheel on these machines; any other version pulls a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
PYTEST_WORKERS ?= 2
# seconds per nightly configuration (0: explore each to the end)
NIGHTLY_BUDGET ?= 600

.PHONY: demo test test-fast lint explore nightly bench soak clean test-torch214

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[torch,test,plot,lint]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/accelpact demo

# Budget: 15 minutes on a 2-core machine from a warm .venv (README, "What `make test` runs"); the 25
# slowest tests are printed at the end of every run so that whoever spends the budget is visible.
test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -q --durations=25

# The quick subset: the model, the contract, the checker and the single-process tests (no spawned ranks).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q -m "not multiproc" tests

# ruff (pyflakes, bugbear, blind except; every noqa/type: ignore names its code), the import layers
# (import-linter, the contracts in pyproject.toml) and mypy, both over the installed layout: subpackages
# live in top-level folders, so both read them through a tree of links (lint-imports run from inside it
# finds the package there).
TYPECHECK := build/typecheck
lint: $(STAMP)
	$(BIN)/ruff check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/accelpact
	cp accelpact/*.py $(TYPECHECK)/accelpact/
	ln -s ../../../accelpact/testing $(TYPECHECK)/accelpact/testing
	ln -s ../../../accelpact/integrations $(TYPECHECK)/accelpact/integrations
	for d in model impl conformance bench; do ln -s ../../../$$d $(TYPECHECK)/accelpact/$$d; done
	cd $(TYPECHECK) && $(CURDIR)/$(BIN)/lint-imports --no-cache $(CURDIR)/pyproject.toml
	MYPYPATH=$(TYPECHECK) $(BIN)/mypy -p accelpact

explore: $(STAMP)
	$(BIN)/accelpact explore --nodes 2 --ranks-per-node 2 --max-faults 2

# What `make test` leaves out, as a person can run it (hours on 2 cores; README, "What `make test` runs"):
# 1. 2x2 with three faults, 3x2 with two, 2x2 with two spares and two crashes, each stopped at NIGHTLY_BUDGET
#    seconds (model/engine_nightly.py);
# 2. every test marked @pytest.mark.nightly("why") with ACCELPACT_NIGHTLY=1: the slow manifest pins and the
#    fast ones' full searches, the corpus regenerated from the model, the mutants on the manifest, FailBench F2
#    on 3x2, the soaks, the benchmarks, the 8-rank and duplicate multi-process runs;
# 3. the whole conformance corpus (`pytest conformance/ --full`), FAST included;
# 4. the fast suite under torch 2.14.1 (test-torch214, below).
nightly: $(STAMP)
	$(BIN)/python -m accelpact.model.engine_nightly --budget $(NIGHTLY_BUDGET) --json build/nightly.json
	ACCELPACT_NIGHTLY=1 $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=25 -m nightly tests conformance
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=25 conformance --full -k scenario_conforms
	$(MAKE) test-torch214

# The fast gloo suite (what `make test` runs) under the next torch, from a second venv (issue 43; bench/README.md,
# "torch 2.14.1 trial"): torch 2.14.1 is a CUDA wheel on these machines' disk that runs on the CPU (about 5.5 GB
# installed).  The project is installed with torch pinned in the same pip call so that pip keeps 2.14.1, with the
# extras the default suite needs (test; plot: the demo's timeline.png and the report's figures).
VENV214  := .venv-torch214
TORCH214 ?= torch==2.14.1
STAMP214 := $(VENV214)/.installed

$(STAMP214): pyproject.toml
	$(PY) -m venv $(VENV214)
	$(VENV214)/bin/pip install -q "$(TORCH214)"
	$(VENV214)/bin/pip install -q -e '.[torch,test,plot]' "$(TORCH214)"
	$(VENV214)/bin/python -c "import sys, torch; v = torch.__version__.split('+')[0]; sys.exit(0 if '$(TORCH214)'.endswith(v) else f'$(VENV214): torch {v}, not $(TORCH214)')"
	touch $(STAMP214)

test-torch214: $(STAMP214)
	$(VENV214)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -q --durations=25

bench: $(STAMP)
	$(BIN)/accelpact bench explore

# A long chaos soak (issue 28; README, "Chaos soak"): SOAK_MINUTES of seeded external faults on one
# torchrun job with two spares, then the judge over the whole history; exit 1 if it is red.  Replay:
# accelpact soak --replay runs/soak/schedule.json.  SOAK_LAUNCHER=restarting also loses the store (a
# store process per attempt), but hangs on engine bug K1 until the soak's stall bound (bench/README.md).
SOAK_MINUTES ?= 30
SOAK_SEED ?= 1
SOAK_LAUNCHER ?= torchrun
soak: $(STAMP)
	$(BIN)/accelpact soak --minutes $(SOAK_MINUTES) --seed $(SOAK_SEED) --spares 2 --launcher $(SOAK_LAUNCHER) --out runs/soak

clean:
	rm -rf $(VENV) build *.egg-info
