# Two entry points (see README):  make demo   |   make test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: demo test install clean bench

# pip install -e . also compiles msprobe/core/_stats_kernel.c (the statistics kernel): rebuild when it changes
$(VENV)/.installed: pyproject.toml msprobe/core/_stats_kernel.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,examples]"
	touch $@

install: $(VENV)/.installed

demo: install
	rm -rf demo_dump  # the demo's own output: a single process writes step{N}/proc{pid}, new per run
	$(PY) examples/lenet_digits.py --dump-path ./demo_dump

test: install
	$(PY) -m pytest -q -p no:cacheprovider tests

bench: install
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) demo_dump build msprobe/core/_stats_kernel.*.so
