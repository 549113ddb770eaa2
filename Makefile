# gpulab: one environment, the labs, the tests, and the nbgrader course workflow.
#
#   make lab     create the environment, release the labs, open JupyterLab on your copies
#   make test    the whole test suite (CPU is enough)
#
# Every target puts .venv/bin first on PATH: nbgrader runs `alembic` (and jupyter) from PATH.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV    := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.gpulab-setup
PYTHON  ?= $(shell command -v python3.11 || command -v python3)
# torch's exact version is pinned once, in constraints.txt. It comes from TORCH_INDEX: the CPU build
# by default (a plain `pip install torch` on Linux pulls the CUDA build and gigabytes of nvidia
# wheels). GPU users: make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128
# (changing the index reinstalls torch from the new one).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIN   := $(shell grep -m1 '^torch==' constraints.txt)
TORCH_STAMP := $(VENV)/.torch-from-$(shell printf '%s %s' '$(TORCH_INDEX)' '$(TORCH_PIN)' | cksum | cut -d' ' -f1)
COURSE  := $(CURDIR)/notebooks
WORK    ?= $(CURDIR)/work
LAB     ?=
# make grade: parallel autogrades, and each submission's limits (empty = the defaults in
# docs/instructor.md: one job per core, 900 s wall clock, nbgrader_config.py's cell timeout, 4 GiB)
JOBS    ?=
WALL_TIMEOUT ?=
CELL_TIMEOUT ?=
MEMORY_MB ?=
# make grade SEED=<n>: the hidden tests' inputs of an earlier run (default: fresh every run)
SEED    ?=
# make collect: the LMS download, and a file-name pattern if the default does not fit
ARCHIVE ?=
REGEXP  ?=
PORT    ?= 8888
# make lab INSTRUCTOR=1: the course root with nbgrader's instructor tools (the default is the student's view)
INSTRUCTOR ?=
PYTEST_ARGS ?=
# make test's workers (pytest-xdist): 2 runs a test file (or one lab's pipeline) per worker at a time, the heaviest first
# (tests/conftest.py). The labs' graded speed checks allow for the other worker's load: the
# grader times a probe of its own beside every timed run and scales the baseline's cap by the load it
# measures against the reference run's, 0.5x to 1.25x (gpulab.course.judge.load_factor). TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# LANG=ko: the Korean edition (make lab LANG=ko, make release LANG=ko), built from the catalogues in
# notebooks/i18n/ko/ into build/i18n/ko (a course root of its own) with its own work folder. LANG=ko is
# a language, not a locale: the recipes run under C.UTF-8 instead, with GPULAB_LANG=ko for the kernels
# (the graders' messages in Korean where the catalogues have them: gpulab.i18n.messages).
KIT_LANGS := ko
ifneq ($(filter $(LANG),$(KIT_LANGS)),)
KIT_LANG := $(LANG)
override LANG := C.UTF-8
export LANG
export GPULAB_LANG := $(KIT_LANG)
COURSE  := $(CURDIR)/build/i18n/$(KIT_LANG)
WORK    := $(CURDIR)/work-$(KIT_LANG)
endif
I18N    = "$(PY)" -m gpulab.i18n
# the translated course root is brought up to date before anything reads it
TRANSLATE = $(if $(KIT_LANG),$(I18N) build --lang $(KIT_LANG) --out "$(COURSE)",:)

.PHONY: help setup lock setup-browser lab i18n-update i18n-check test test-fast test-browser lint release check grade feedback collect bench gpu-check doctor clean hub-setup hub hub-release hub-extend hub-collect hub-feedback test-hub

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

setup: $(STAMP)  ## create .venv/ and install everything (quick when already done)

$(PY):
	@echo "creating $(VENV) with $(PYTHON)"
	"$(PYTHON)" -m venv "$(VENV)"
	@"$(PY)" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpulab needs Python >= 3.11; run: rm -rf .venv && make setup PYTHON=python3.11")'

# torch alone first, from TORCH_INDEX, without its dependencies (the next step takes those from
# PyPI). A stamp per index and torch pin: after `make setup TORCH_INDEX=<another>`, or a new pin in
# constraints.txt, torch is reinstalled (other pins there do not touch torch).
$(TORCH_STAMP): | $(PY)
	@if ls "$(VENV)"/.torch-from-* >/dev/null 2>&1; then force="--force-reinstall"; \
	  echo "reinstalling torch from $(TORCH_INDEX) (the index or the pinned version changed)"; else force=""; fi; \
	"$(PY)" -m pip install --quiet --no-deps -c constraints.txt torch $$force --index-url "$(TORCH_INDEX)"
	@rm -f "$(VENV)"/.torch-from-*
	@touch "$@"

# Everything but torch comes from requirements.lock: every package pinned, with its hashes (make lock
# refreshes it). torch's own dependencies are in the lock; on a CUDA build, its CUDA libraries come
# from TORCH_INDEX in the third step (on the CPU build that step finds everything there already).
$(STAMP): pyproject.toml constraints.txt requirements.lock $(TORCH_STAMP)
	"$(PY)" -m pip install --quiet --require-hashes --no-deps -r requirements.lock
	"$(PY)" -m pip install --quiet --no-deps --no-build-isolation -e .
	"$(PY)" -m gpulab.devices.shadow install
	"$(PY)" -m pip install --quiet -c constraints.txt torch --index-url "$(TORCH_INDEX)"
	"$(PY)" -m pip check
	@"$(PY)" -c 'import torch; b = torch.version.cuda; print("torch", torch.__version__, "(CUDA " + b + ")" if b else "(CPU build)")'
	@touch "$@"
	@echo "environment ready: $(VENV) ($$(du -sh "$(VENV)" | cut -f1) on disk)"

# The lock: pyproject's extras resolved for Python 3.11 on every platform (uv's --universal), with
# hashes. torch and its CUDA-only wheels are left out: they come from TORCH_INDEX (see above).
LOCK_EXTRAS := course search hub browser test
LOCK_SKIP   := torch triton cuda-bindings cuda-pathfinder cuda-toolkit nvidia-cublas nvidia-cuda-cupti \
	nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand \
	nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvjitlink \
	nvidia-nvshmem-cu13 nvidia-nvtx
lock: | $(PY)  ## re-resolve requirements.lock from pyproject.toml + constraints.txt (every pin, with hashes)
	"$(PY)" -m pip install --quiet "uv>=0.9,<1"
	"$(VENV)/bin/uv" pip compile pyproject.toml $(addprefix --extra ,$(LOCK_EXTRAS)) -c constraints.txt \
		--python-version 3.11 --universal --generate-hashes $(addprefix --no-emit-package ,$(LOCK_SKIP)) \
		--custom-compile-command "make lock" --quiet -o requirements.lock
	@echo "requirements.lock: $$(grep -c '^[a-z0-9]' requirements.lock) pinned packages"

lab: setup  ## release changed labs, copy new ones into work/, start JupyterLab (PORT=, INSTRUCTOR=1, LANG=ko)
	$(TRANSLATE)
	"$(PY)" -m gpulab.course.lab --course "$(COURSE)" --work "$(WORK)" --port $(PORT) $(if $(INSTRUCTOR),--instructor)

test: setup  ## the translations' check, then the whole test suite on two workers (TEST_WORKERS=0: one process)
	$(MAKE) --no-print-directory i18n-check
	"$(PY)" -m pytest $(XDIST) $(PYTEST_ARGS)

i18n-update: setup  ## merge the English source into a language's catalogues (LANG=ko; LAB= one lab, NEW=1 starts missing ones)
	@[ -n "$(KIT_LANG)" ] || { echo "which language? make i18n-update LANG=ko" >&2; exit 2; }
	$(I18N) update --lang $(KIT_LANG) $(if $(LAB),--lab $(LAB)) $(if $(filter 1,$(NEW)),--new)

i18n-check: setup  ## fail on a missing, stale (fuzzy) or orphaned translation, or one that lost code, numbers or glossary terms
	@for lang in $(or $(KIT_LANG),$(KIT_LANGS)); do $(I18N) check --lang $$lang || exit 1; done

test-fast: setup  ## the unit tests only (no notebook pipeline)
	"$(PY)" -m pytest -m "not notebook" $(XDIST) $(PYTEST_ARGS)

lint: setup  ## ruff over the package, tests, benchmarks and tools (config in pyproject.toml)
	"$(PY)" -m ruff check gpulab tests benchmarks tools

# Playwright (from requirements.lock) drives the system's Chromium: Playwright's own browser download
# is not possible everywhere. make setup-browser installs Debian's package, explicitly (CI calls it
# first); make test-browser installs nothing and names what is missing.
CHROMIUM ?= $(shell command -v chromium || command -v chromium-browser || echo /usr/bin/chromium)
SUDO    := $(if $(filter 0,$(shell id -u)),,sudo)
setup-browser: setup  ## install Chromium and a Korean font for make test-browser (Debian/Ubuntu: apt, as root or with sudo)
	@if [ -x "$(CHROMIUM)" ]; then echo "chromium: $(CHROMIUM) ($$("$(CHROMIUM)" --version 2>/dev/null))"; \
	elif command -v apt-get >/dev/null; then echo "installing chromium (apt)"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; \
	else echo "no apt-get here: install Chromium with your system's package manager, then make test-browser CHROMIUM=/path/to/chromium" >&2; exit 1; fi
	@# the Korean edition's page needs a Korean font, or Chromium draws boxes (the browser test checks for one)
	@if [ -n "$$(fc-list :lang=ko 2>/dev/null)" ]; then echo "a Korean font: $$(fc-list :lang=ko family | head -1)"; \
	elif command -v apt-get >/dev/null; then echo "installing a Korean font (fonts-nanum, apt)"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq fonts-nanum >/dev/null; \
	else echo "no Korean font and no apt-get: install one (Nanum or Noto Sans CJK) for the Korean edition" >&2; exit 1; fi

test-browser: setup  ## JupyterLab as `make lab` starts it, driven in headless Chromium; screenshots in test-artifacts/browser/
	@[ -x "$(CHROMIUM)" ] || { echo "no Chromium at $(CHROMIUM): run make setup-browser (or give CHROMIUM=/path/to/chromium)" >&2; exit 1; }
	@"$(PY)" -c "import playwright.sync_api" 2>/dev/null || { echo "Playwright is missing from $(VENV): run make setup" >&2; exit 1; }
	CHROMIUM="$(CHROMIUM)" "$(PY)" -m pytest tests/browser/browser_lab.py -v -p no:cacheprovider $(PYTEST_ARGS)

# make hub: the class on one server (docs/instructor.md, "Host the class on one server"). JupyterHub
# (PyPI, in requirements.lock) comes with make setup; configurable-http-proxy (npm) goes into
# .venv/lib/gpulab-hub, installed here when missing. Run as root (sudo): PAM logins, each server started as its user.
ROSTER  ?=
CREATE_USERS ?=
HUB_IP  ?= 127.0.0.1
HUB_PORT ?= 8000
BASE_URL ?= /
SSL_CERT ?=
SSL_KEY ?=
HUB_STATE ?= /var/lib/gpulab-hub
EXCHANGE ?= /usr/local/share/nbgrader/exchange
CULL_IDLE ?= 3600
CPUS_PER_STUDENT ?=
MEM_PER_STUDENT ?=
DUE     ?=
HUB_PROXY := $(VENV)/lib/gpulab-hub/node_modules/.bin/configurable-http-proxy
hub-setup: setup
	@"$(PY)" -c "import jupyterhub, jupyterhub_idle_culler" 2>/dev/null || \
		{ echo "JupyterHub is missing from $(VENV) (the hub extra of requirements.lock): run make setup" >&2; exit 1; }
	@if [ ! -x "$(HUB_PROXY)" ]; then \
		if ! command -v npm >/dev/null; then echo "installing nodejs and npm (apt), for configurable-http-proxy"; \
			$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm >/dev/null; fi; \
		npm install --silent --no-audit --no-fund --prefix "$(VENV)/lib/gpulab-hub" "configurable-http-proxy@4"; fi

hub: hub-setup  ## JupyterHub for the class, as root: make hub ROSTER=roster.csv [CREATE_USERS=1 HUB_PORT= BASE_URL= SSL_CERT= SSL_KEY= HUB_IP=]
	"$(PY)" -m gpulab.hub serve --roster "$(ROSTER)" --course "$(COURSE)" --state "$(HUB_STATE)" --exchange "$(EXCHANGE)" \
		--ip "$(HUB_IP)" --port $(HUB_PORT) --base-url "$(BASE_URL)" --cull-idle $(CULL_IDLE) $(if $(filter 1,$(CREATE_USERS)),--create-users) \
		$(if $(SSL_CERT),--ssl-cert "$(SSL_CERT)" --ssl-key "$(SSL_KEY)") $(if $(CPUS_PER_STUDENT),--cpus-per-student $(CPUS_PER_STUDENT)) \
		$(if $(MEM_PER_STUDENT),--mem-per-student $(MEM_PER_STUDENT))

hub-release: setup  ## release a lab to the hub's exchange: make hub-release LAB=00_setup [DUE="2026-10-01 17:00:00 UTC"] (a past DUE: asks, or FORCE=1)
	"$(PY)" -m gpulab.hub release --course "$(COURSE)" --state "$(HUB_STATE)" --lab "$(LAB)" $(if $(DUE),--due "$(DUE)") $(if $(filter 1,$(FORCE)),--force)

hub-extend: setup  ## one student's extension, honoured by make grade: make hub-extend LAB=00_setup STUDENT=alice UNTIL="2026-10-03 17:00:00 UTC" (UNTIL=none removes it)
	"$(PY)" -m gpulab.hub extend --course "$(COURSE)" --state "$(HUB_STATE)" --lab "$(LAB)" --student "$(STUDENT)" --until "$(UNTIL)"

hub-collect: setup  ## the exchange's submissions of a lab -> notebooks/submitted/ (then make grade): make hub-collect LAB=00_setup
	"$(PY)" -m gpulab.hub collect --course "$(COURSE)" --state "$(HUB_STATE)" --lab "$(LAB)"

hub-feedback: setup  ## clean feedback of a graded lab, released through the exchange: make hub-feedback LAB=00_setup
	"$(PY)" -m gpulab.hub feedback --course "$(COURSE)" --state "$(HUB_STATE)" --lab "$(LAB)"

# a real hub on loopback, three students and an instructor as real local accounts (root; made and
# removed by the test), driven in headless Chromium; screenshots in test-artifacts/hub/
test-hub: hub-setup  ## the class on one server, end to end in a real browser (root; Chromium from make setup-browser); screenshots in test-artifacts/hub/
	@[ -x "$(CHROMIUM)" ] || { echo "no Chromium at $(CHROMIUM): run make setup-browser (or give CHROMIUM=/path/to/chromium)" >&2; exit 1; }
	@"$(PY)" -c "import playwright.sync_api" 2>/dev/null || { echo "Playwright is missing from $(VENV): run make setup" >&2; exit 1; }
	CHROMIUM="$(CHROMIUM)" "$(PY)" -m pytest tests/browser/browser_hub.py -v -p no:cacheprovider $(PYTEST_ARGS)

release: setup  ## nbgrader generate_assignment for every lab (notebooks/release; LANG=ko: build/i18n/ko/release)
	$(TRANSLATE)
	"$(PY)" -m gpulab.course release --course "$(COURSE)" $(if $(LAB),--lab $(LAB))

check: setup  ## validate your notebooks in work/
	"$(PY)" -m gpulab.course check --work "$(WORK)" $(if $(LAB),--lab $(LAB))

grade: setup  ## autograde notebooks/submitted in parallel, sandboxed; grades.csv (LAB= JOBS= WALL_TIMEOUT= CELL_TIMEOUT= MEMORY_MB= ALLOW_WEAKER_SANDBOX=1 RAY_ADDRESS= FRESH=1 SEED=)
	"$(PY)" -m gpulab.autograde --course "$(COURSE)" $(if $(LAB),--lab $(LAB)) $(if $(JOBS),--jobs $(JOBS)) \
		$(if $(WALL_TIMEOUT),--wall-timeout $(WALL_TIMEOUT)) $(if $(CELL_TIMEOUT),--cell-timeout $(CELL_TIMEOUT)) \
		$(if $(MEMORY_MB),--memory-mb $(MEMORY_MB)) $(if $(filter 1,$(ALLOW_WEAKER_SANDBOX)),--allow-weaker-sandbox) \
		$(if $(RAY_ADDRESS),--ray-address $(RAY_ADDRESS)) $(if $(filter 1,$(FRESH)),--fresh) $(if $(SEED),--seed $(SEED))

feedback: setup  ## HTML feedback for every graded submission, hidden tests removed (LAB=<lab> for one)
	"$(PY)" -m gpulab.course feedback --course "$(COURSE)" $(if $(LAB),--lab $(LAB))

collect: setup  ## import an LMS download: make collect LAB=00_setup ARCHIVE=submissions.zip [REGEXP=...]
	"$(PY)" -m gpulab.course collect --course "$(COURSE)" --lab "$(LAB)" --archive "$(ARCHIVE)" \
		$(if $(REGEXP),--regexp '$(value REGEXP)')

bench: setup  ## run every benchmark; each prints one JSON line
	@for b in benchmarks/*.py; do echo "== $$b"; "$(PY)" "$$b"; done

# gpu-check runs with a python whose torch is a CUDA build: the venv's if it is one, else the machine's python3
GPU_PY ?= $(shell "$(PY)" -c "import sys, torch; sys.exit(not torch.version.cuda)" 2>/dev/null && echo "$(PY)" || command -v python3)

gpu-check:  ## on a lent GPU machine, its own torch, installs nothing: CUDA probe in the sandbox, GPU tests, the labs it can run, benchmarks -> benchmarks/results/ (GPU_CHECK_ARGS="--plan 15min", GPU_PY=...)
	"$(GPU_PY)" tools/gpu_check.py $(GPU_CHECK_ARGS)

doctor: setup  ## what this machine has, and what will run on real devices
	"$(PY)" -m gpulab doctor

clean:  ## remove generated release/feedback copies and caches (never work/, submitted/ or the gradebook)
	rm -rf "$(COURSE)/release" "$(COURSE)/feedback" .pytest_cache .hypothesis test-artifacts
	find . -name __pycache__ -type d -prune -not -path './.venv/*' -exec rm -rf {} +
