# raymetal: `make demo` builds the lab and deploys a Ray cluster on it;
# `make test` runs every check CI runs. Both install what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LAB := lab/lab.sh
INVENTORY ?= inventory/lab
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)
# Python keeps the compiled code of what it imports, as it does on a controller by default. With
# PYTHONDONTWRITEBYTECODE set (some CI images set it), every task's worker process compiles the
# collection's filter plugins from source again: 17 % of a full deploy's controller CPU on the lab
# (docs/scale.md). Not inherited by the commands make runs.
unexport PYTHONDONTWRITEBYTECODE

# Molecule scenarios `make molecule` runs, one after another, cluster (the one that starts Ray) last.
MOLECULE_ALL := $(sort $(notdir $(patsubst %/molecule.yml,%,$(wildcard extensions/molecule/*/molecule.yml))))
MOLECULE_SCENARIOS ?= $(filter-out cluster,$(MOLECULE_ALL)) $(filter cluster,$(MOLECULE_ALL))
# `make test` runs every scenario but cluster: its converge (playbooks/deploy.yml
# on a head and two workers wired like the lab) is what each lab's session deploy
# already is, from scratch, and the labs prove its steps on it: lab 1 on Debian 12
# (tests/lab/test_ray_cluster.py), lab 2 on Debian 13 (tests/lab/test_cluster_scenario.py:
# the idempotence, the check, the scenario's verify.yml), and the scenario's
# ray_wheelhouse_fanout copy in tests/lab/test_scale_out.py. A third fresh cluster
# beside the labs cost its controller 95 CPU-seconds on a quiet day (run12), its
# containers 455 on a slow one (run33), where it
# started Ray while the labs restarted theirs (docs/testing.md).
MOLECULE_TEST_SCENARIOS ?= $(filter-out cluster,$(MOLECULE_ALL))
# The cluster scenario runs on Debian 13 (MOLECULE_CLUSTER_RELEASES="bookworm trixie":
# both); each release's run has instance names and networks of its own
# (extensions/molecule/cluster/molecule.yml), so that the two never meet.
MOLECULE_CLUSTER_RELEASES ?= trixie
MOLECULE_CLUSTER_ENV_bookworm ?=
MOLECULE_CLUSTER_ENV_trixie ?= MOLECULE_CLUSTER_PREFIX=mc13 MOLECULE_CLUSTER_MGMT=10.231.161 MOLECULE_CLUSTER_FABRIC=10.231.171
# Debian releases whose node image, wheels and apt mirror make test builds first.
LAB_PREP_RELEASES ?= bookworm trixie

.PHONY: help deps venv lab-up lab-down lab-status demo deploy status docs lint unit molecule e2e test lab-prep test-labs bench clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

deps: ## Install the OS packages the controller needs (docker.io, debootstrap, rsync, ssh; promtool)
	@bash $(LAB) deps

$(BIN)/.installed: requirements.txt requirements-dev.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt
	@touch $@

venv: $(BIN)/.installed ## Create .venv with the pinned toolchain

lab-up: deps venv ## Start the lab: 1 head + LAB_WORKERS (2) workers, offline, with ib0
	@bash $(LAB) up

lab-down: ## Remove the lab's containers, networks and key, and any lab beside it (keeps the cached image and wheelhouse)
	@bash $(LAB) down
	@for d in lab/.labs/*/; do [ ! -d "$$d" ] || LAB_PREFIX=$$(basename "$$d") bash $(LAB) down; done

lab-status: ## Show the lab's nodes
	@bash $(LAB) status

demo: lab-up ## Build the lab, deploy a 3-node Ray cluster, print its resources
	$(BIN)/ansible-playbook site.yml -i $(INVENTORY)

deploy: venv ## Deploy onto INVENTORY (default: the lab)
	$(BIN)/ansible-playbook site.yml -i $(INVENTORY)

status: venv ## Print the cluster's nodes and resources
	$(BIN)/ansible-playbook playbooks/status.yml -i $(INVENTORY)

# The docs site: antsibull-docs and Sphinx, warnings as errors (tools/docsite/build.sh), offline.
DOCSITE ?= build/docsite

docs: venv ## Role READMEs' options from meta/argument_specs.yml (aar-doc), then the docs site in build/docsite/html (antsibull-docs)
	$(BIN)/python tools/role_docs.py
	bash tools/docsite/build.sh $(DOCSITE)
	@echo "docs site: $(DOCSITE)/html/index.html"

lint: venv ## Role READMEs up to date, docs site builds, changelog fragments valid, yamllint, ansible-lint (production profile), ansible-test sanity
	$(BIN)/python tools/role_docs.py --check
	bash tools/docsite/build.sh $(DOCSITE)
	$(BIN)/antsibull-changelog lint
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint --strict
	BIN=$(CURDIR)/$(BIN) bash tools/sanity.sh

unit: venv deps ## Unit tests (modules, filters, fixtures)
	$(BIN)/pytest -q -p no:cacheprovider --junitxml=artifacts/junit-unit.xml tests/unit

molecule: venv lab-prep ## Molecule scenarios (each with its idempotence step; cluster on Debian 13, MOLECULE_CLUSTER_RELEASES)
	@export RAYMETAL_CACHE=$${RAYMETAL_CACHE:-$$HOME/.cache/raymetal}; \
	for s in $(MOLECULE_SCENARIOS); do \
	  releases=bookworm; [ "$$s" != cluster ] || releases="$(MOLECULE_CLUSTER_RELEASES)"; \
	  for r in $$releases; do \
	    echo "=== molecule test -s $$s (Debian $$r)"; \
	    image=$$(LAB_RELEASE=$$r bash $(LAB) image-name) || exit 1; \
	    case $$r in bookworm) names="$(MOLECULE_CLUSTER_ENV_bookworm)";; trixie) names="$(MOLECULE_CLUSTER_ENV_trixie)";; *) names="";; esac; \
	    nice=$$(tr -cd 0-9 < artifacts/molecule.nice 2>/dev/null); \
	    nice -n $${nice:-0} tools/timed.sh "molecule $$s (Debian $$r)" env RAYMETAL_LAB_IMAGE=$$image $$names $(BIN)/molecule test -s $$s || exit 1; \
	  done; \
	done

# Labs side by side for the end-to-end tests (tools/e2e.sh; 1 runs them all on the built-in lab).
E2E_LABS ?= 2

e2e: deps venv lab-prep ## End-to-end tests against the lab (E2E_LABS labs side by side, default 2)
	@E2E_LABS=$(E2E_LABS) bash tools/e2e.sh

# The whole machine's busy CPU (jiffies: user, nice, system, irq, softirq, steal) and the time, for the
# report's "cores on average": the suite is CPU-bound when that is near the number of cores.
MACHINE_CPU = echo "$$(awk '/^cpu /{ print $$2 + $$3 + $$4 + $$7 + $$8 + $$9 }' /proc/stat) $$(date +%s)"

# Lint and the unit tests run behind everything else (tools/background.sh: a CPU cgroup of low weight, and nice 19):
# they wait on nothing, while the labs start Ray within its
# timeouts; on a loaded machine the labs take the CPU first and lose no minute.
test: ## Everything CI runs: lab prep, then molecule (every scenario but cluster, whose steps the labs run) beside the lab end-to-end tests, with lint and unit beside them; a table of phases and the slowest tests at the end
	@rm -rf artifacts; mkdir -p artifacts; rc=0; $(MACHINE_CPU) > artifacts/cpu.start; \
	tools/cpu_timeline.sh artifacts/cpu-timeline.tsv >/dev/null 2>&1 & tlp=$$!; \
	tools/timed.sh "setup: OS packages, venv" $(MAKE) --no-print-directory deps venv || rc=$$?; \
	if [ $$rc -eq 0 ]; then \
	  echo "=== lint and unit run beside the lab's preparation and the lab tests, behind them (tools/background.sh; artifacts/lint.log, artifacts/unit.log)"; \
	  ( tools/background.sh tools/timed.sh lint $(MAKE) --no-print-directory lint > artifacts/lint.log 2>&1; echo $$? > artifacts/lint.rc ) & lintp=$$!; \
	  ( tools/background.sh tools/timed.sh unit $(MAKE) --no-print-directory unit > artifacts/unit.log 2>&1; echo $$? > artifacts/unit.rc ) & unitp=$$!; \
	  echo "=== the lab's image, wheelhouse and package mirror (artifacts/lab-prep.log)"; \
	  tools/timed.sh "lab prep: images, wheelhouses, mirrors" $(MAKE) --no-print-directory lab-prep > artifacts/lab-prep.log 2>&1 || rc=1; \
	  cat artifacts/lab-prep.log; \
	  [ $$rc -ne 0 ] || $(MAKE) --no-print-directory test-labs || rc=$$?; \
	  wait $$lintp $$unitp; \
	  for step in lint unit; do echo "=== $$step (artifacts/$$step.log)"; cat artifacts/$$step.log; \
	    [ "$$(cat artifacts/$$step.rc 2>/dev/null)" = 0 ] || { echo "=== $$step FAILED"; rc=1; }; done; \
	fi; \
	$(MAKE) --no-print-directory lab-down || true; \
	$(MACHINE_CPU) > artifacts/cpu.end; kill $$tlp 2>/dev/null; wait $$tlp 2>/dev/null; \
	$(BIN)/python tools/suite_report.py artifacts 2>/dev/null || python3 tools/suite_report.py artifacts || true; \
	exit $$rc

# What molecule and the labs share, built once per Debian release (each step is cached).
lab-prep: deps
	@for r in $(LAB_PREP_RELEASES); do \
	  LAB_RELEASE=$$r bash $(LAB) image && LAB_RELEASE=$$r bash $(LAB) wheelhouse \
	    && LAB_RELEASE=$$r bash $(LAB) mirror-build >/dev/null || exit 1; \
	done

# The molecule scenarios and the lab tests use their own containers and
# networks, and both spend much of their time waiting on nodes, so they run
# side by side. Molecule's output goes to artifacts/molecule.log and is
# printed whole when both end. A scenario that starts while a lab's first
# deploy runs (no line yet in artifacts/cost-labN.tsv) runs at nice 19 (the
# first deploys start Ray against its deadlines); every later one at the labs'
# priority: at nice 19 throughout, molecule's controller starved behind the
# labs (its nodes did not), and molecule became the longest path (CI,
# 2026-11-29: two scenarios left at 80 minutes). artifacts/molecule.nice holds
# the niceness the next scenario starts at.
test-labs: lab-prep venv
	@mkdir -p artifacts; log=artifacts/molecule.log; rm -f $$log artifacts/molecule.rc artifacts/cost-lab*.tsv; \
	echo 19 > artifacts/molecule.nice; \
	( for i in $$(seq 720); do ok=1; for n in $$(seq $(E2E_LABS)); do [ -s artifacts/cost-lab$$n.tsv ] || ok=0; done; \
	  [ $$ok = 0 ] || break; sleep 5; done; echo 0 > artifacts/molecule.nice ) >/dev/null 2>&1 & npid=$$!; \
	echo "=== molecule scenarios ($(MOLECULE_TEST_SCENARIOS)) run beside the lab tests (at nice 19 while the labs' first deploys run); output in $$log, printed when both end"; \
	( $(MAKE) --no-print-directory molecule MOLECULE_SCENARIOS="$(MOLECULE_TEST_SCENARIOS)" > $$log 2>&1; echo $$? > artifacts/molecule.rc ) & mpid=$$!; \
	erc=0; $(MAKE) --no-print-directory e2e || erc=$$?; \
	kill $$npid 2>/dev/null; echo 0 > artifacts/molecule.nice; \
	wait $$mpid; mrc=$$(cat artifacts/molecule.rc 2>/dev/null || echo 1); \
	echo "=== molecule output ($$log)"; cat $$log; \
	echo "=== lab end-to-end tests in short (whole output above)"; \
	for f in artifacts/e2e-lab*.log; do [ -f "$$f" ] && grep -HE '^(FAILED|ERROR) |(passed|failed|errors?)( |,).* in [0-9.]+s' "$$f"; done; \
	echo "=== molecule: exit $$mrc; lab end-to-end tests: exit $$erc"; \
	[ "$$mrc" = 0 ] && [ "$$erc" = 0 ]

bench: lab-up ## Benchmarks (print ratios measured in one run; the deploy bench makes its own lab)
	$(BIN)/python bench/deploy/run.py
	$(BIN)/ansible-playbook site.yml -i $(INVENTORY)
	$(BIN)/python bench/facts/run.py -i $(INVENTORY) -n 10

clean: lab-down ## Remove the lab and the venv
	rm -rf $(VENV) .cache artifacts
