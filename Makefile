# Plumb's two commands: `make run` (the whole service) and `make test` (the whole suite).
# Both bootstrap the virtual environment from pyproject.toml first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# manage.py itself runs with DEBUG on and the generated dev key; the processes
# `runstack` starts run as in production, DEBUG off, with a key generated once in var/,
# and so do its migrate and collectstatic (the key encrypts stored callback secrets).
export DEBUG ?= true

.PHONY: run demo test lint bootstrap clean

run: bootstrap
	$(PY) manage.py runstack

demo: bootstrap
	$(PY) manage.py runstack --demo

test: bootstrap
	$(PY) bin/test

lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bootstrap: $(VENV)/.installed

# uv installs what pip would, from the same index, in seconds rather than most of a
# minute; pip does it when uv cannot (a platform without its wheel, pip's own settings
# for an index or a proxy that uv does not read). Compiled to bytecode as pip does: uv
# leaves that to the first import, which never writes it where PYTHONDONTWRITEBYTECODE is
# set, and every process then compiled its libraries from source at each start.
UV := 0.13.9

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check 'uv==$(UV)' \
		&& $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) '.[dev]' \
		|| ($(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip \
			&& $(PY) -m pip install --quiet --disable-pip-version-check '.[dev]')
	rm -rf build plumb.egg-info
	touch $@

clean:
	rm -rf $(VENV) var build plumb.egg-info
