# The project's entry points. `make demo` and `make test` set everything up on a fresh machine:
# a virtual environment at .venv with the project and all its dependencies (see pyproject.toml).
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: setup demo test lint typecheck unit crds clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[trainer,local,dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/rtj demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

# Regenerate crds/ (and the chart's copy) from the pydantic models.
crds: $(STAMP)
	$(BIN)/rtj crd --write

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
