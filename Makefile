# `make test` builds .venv from scratch (only Python 3.10+ and make needed)
# and runs the whole suite.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: test clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(VENV)/bin/python -m pip install -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(VENV)/bin/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
