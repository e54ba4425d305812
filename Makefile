# gptcli developer tasks. Everything runs inside .venv, created on first use.
#
#   make test                 ruff + pytest (installs torch, then gptcli[dev,plot])
#   make test-hf-chat         the chat template against Hugging Face's (CI runs it)
#   make test-llamacpp        GGUF files run by llama.cpp itself (CI runs it)
#   make test-oldest-typer    the CLI tests with the oldest Typer pyproject allows (CI runs it)
#   make gpu-check            on a GPU machine: everything bench/gpu_check.py measures, one
#                             report (NANOGPT=DIR to run nanoGPT beside; DRY_RUN=1: tiny, CPU)
#   make demo                 train the demo GPT on examples/demo (once) and sample from it
#                             (installs torch, then gptcli[plot]: no test dependencies)
#   make docs                 the documentation site, built with --strict into site/
#                             (make docs-serve to browse it at http://127.0.0.1:8000)
#   make docs-figures         redraw the docs' pictures from runs/demo (after make demo)
#   make tour                 replay every `$ ` command of the README and the docs pages on
#                             a fresh clone of HEAD, checked against what they show
#   make test TORCH=torch TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu"
#                             pick another torch build (CUDA, ROCm, CPU wheel index, ...)

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
EXTRAS ?= dev,plot
DEMO_EXTRAS ?= plot

BIN := $(VENV)/bin
STAMP := $(VENV)/.gptcli-installed-$(EXTRAS)
DEMO_STAMP := $(VENV)/.gptcli-installed-$(DEMO_EXTRAS)
DOCS_STAMP := $(VENV)/.gptcli-installed-docs

.PHONY: install test test-lm-eval test-browser test-hf-chat test-llamacpp test-oldest-typer lint demo gpu-check docs docs-serve docs-figures tour clean

install: $(STAMP)

# torch goes in first so that the project's `torch>=2.9` is already satisfied and pip
# never pulls a different (multi-GB) build as a dependency.
# one stamp per set of extras: `make demo` needs only plot, `make test` adds dev
$(VENV)/.gptcli-installed-%: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_INDEX) "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[$*]"
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .

# pytest-xdist's workers: one more than the CPUs (at most 16), as tests spend part of their
# time waiting on the commands they start; each worker's torch takes its share of the cores
# (tests/conftest.py). On a 2-core Zen 3 the suite took 8m31s with 3 workers, 10m44s with 2
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; n = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1; print(min(n + 1, 16))" 2>/dev/null || echo 2)
PYTEST_ARGS ?= -n $(TEST_WORKERS)

test: lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# lm-evaluation-harness's local-completions model against gptcli serve (lm-eval is heavy:
# installed here, not a dev dependency; pip's registry is all it needs)
LM_EVAL ?= lm-eval[api]==0.4.13
test-lm-eval: $(STAMP)
	$(BIN)/python -m pip install -q "$(LM_EVAL)"
	$(BIN)/python -m pytest -q -p no:cacheprovider -m lm_eval tests/test_lm_eval.py

# the playground page in a real browser: Playwright (the package only, never its browsers)
# driving the system's chromium
PLAYWRIGHT ?= playwright>=1.40
test-browser: $(STAMP)
	$(BIN)/python -m pip install -q "$(PLAYWRIGHT)"
	$(BIN)/python -m pytest -q -p no:cacheprovider -m browser tests/test_playground.py

# the chat template against Hugging Face's apply_chat_template (100 conversations per
# tokenizer) and its text-generation pipeline (transformers is a dev dependency)
test-hf-chat: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m hf_chat tests/test_chat_hf.py

# GGUF files run by llama.cpp itself: llama-cpp-python compiles llama.cpp from source (10 to
# 20 minutes on 2 cores), so a wheel built once is kept in LLAMA_WHEELS and installed from there
LLAMA_CPP ?= llama-cpp-python==0.3.36
LLAMA_WHEELS ?= $(HOME)/.cache/gptcli-wheels
test-llamacpp: $(STAMP)
	mkdir -p $(LLAMA_WHEELS)
	$(BIN)/python -m pip install -q --find-links $(LLAMA_WHEELS) "$(LLAMA_CPP)" || \
	  { $(BIN)/python -m pip wheel -q --no-deps -w $(LLAMA_WHEELS) "$(LLAMA_CPP)" && \
	    $(BIN)/python -m pip install -q --find-links $(LLAMA_WHEELS) "$(LLAMA_CPP)"; }
	$(BIN)/python -m pytest -q -p no:cacheprovider -m llamacpp tests/test_llamacpp.py

# the CLI's tests again with the oldest Typer (and Click) pyproject allows, put in front
# of the installed one: the lower bound is checked, not guessed
OLDEST_TYPER ?= typer==0.12.5 click==8.1.7
test-oldest-typer: $(STAMP)
	rm -rf .oldest-typer && $(BIN)/python -m pip install -q --no-deps --target .oldest-typer $(OLDEST_TYPER)
	PYTHONPATH=.oldest-typer $(BIN)/python -m pytest -q $(PYTEST_ARGS) -p no:cacheprovider \
	  tests/test_shell.py tests/test_bad_input.py tests/test_cli_tokenize.py tests/test_everyday.py \
	  tests/test_verbs.py

# on a lent GPU, in one call: bench/gpu_check.py (CI runs it with DRY_RUN=1, so it cannot rot);
# GPU_CHECK_ARGS="--skip suite --batches 64" for a shorter run. GPU_PYTHON=python3 runs it with
# the Python at hand and installs nothing (a GPU image with its own CUDA torch, no network;
# bench/gpu-wheels.txt lists what such an image may lack of gptcli's dependencies).
GPU_REPORT ?= gpu-report.md
GPU_CHECK_ARGS ?=
GPU_PYTHON ?=
gpu-check: $(if $(GPU_PYTHON),,$(STAMP))
	$(or $(GPU_PYTHON),$(BIN)/python) bench/gpu_check.py --out $(GPU_REPORT) $(if $(DRY_RUN),--dry-run) $(if $(NANOGPT),--nanogpt $(NANOGPT)) $(GPU_CHECK_ARGS)

DEMO_RUN ?= runs/demo

# trains once (about two minutes on a laptop CPU); a later run finishes an interrupted
# training with --resume, or samples straight away when it is complete
demo: $(DEMO_STAMP)
	if [ -f $(DEMO_RUN)/last/checkpoint.json ]; then \
	  $(BIN)/gptcli pretrain examples/demo --resume --out $(DEMO_RUN); \
	else \
	  rm -rf $(DEMO_RUN) && $(BIN)/gptcli pretrain examples/demo --config examples/configs/demo.yaml --out $(DEMO_RUN); \
	fi
	$(BIN)/gptcli sample --ckpt $(DEMO_RUN) --num-samples 3 --seed 1
	$(BIN)/gptcli sample --ckpt $(DEMO_RUN) --prompt "The rabbit dug a" --show-probs 5 \
	  --max-new-tokens 1 --temp 0
	@echo
	@echo "gptcli is installed in $(VENV)/bin. To type the README's commands as they are, activate it:"
	@echo "  . $(VENV)/bin/activate        (then: gptcli sample --ckpt $(DEMO_RUN) --prompt \"The fox\")"

# the site: mkdocs.yml's pages, and the CLI reference generated from the app while building
docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

docs-serve: $(DOCS_STAMP)
	$(BIN)/mkdocs serve

# the pictures are committed: building the docs trains nothing
docs-figures: $(DEMO_STAMP)
	$(BIN)/python docs/make_figures.py

# every example is run (CI too): a fresh clone of HEAD, make demo, then each `$ ` command
tour:
	$(PYTHON) tests/tour.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .oldest-typer site
