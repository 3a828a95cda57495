# Two entry points (see README):  make demo   |   make test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: demo test test-full install clean bench bench-compare

# pip install -e . also compiles the C extensions (statistics kernel, per-call path, GRAPH_MODE probes,
# batch .npy writes): rebuild when one of them changes
C_SOURCES := $(wildcard msprobe/*/*.c msprobe/*/*/*.c)
$(VENV)/.installed: pyproject.toml $(C_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,examples]"
	touch $@

install: $(VENV)/.installed

demo: install
	rm -rf demo_dump demo_dump_fp16 demo_compare demo_watch  # the demo's own output, new per run
	$(PY) examples/lenet_digits.py --dump-path ./demo_dump
	@echo "--- the same training in float16; compare its step 0 with float32's and name the first"
	@echo "--- difference (within fp16 tolerance: exit 0, agree or differ in precision; bitwise with --exact: exit 1)"
	$(PY) examples/lenet_digits.py --dtype float16 --steps 3 --dump-steps 0 --dump-path ./demo_dump_fp16
	$(VENV)/bin/msprobe compare -tp ./demo_dump_fp16 -gp ./demo_dump --step 0 -o ./demo_compare
	$(VENV)/bin/msprobe first-diff ./demo_dump_fp16 ./demo_dump --step 0 || test $$? -eq 1
	$(VENV)/bin/msprobe first-diff ./demo_dump_fp16 ./demo_dump --step 0 --exact || test $$? -eq 1
	@echo "--- watch mode: no step list, a NaN made at step 7; only the history around it is written"
	$(PY) examples/lenet_digits.py --watch --nan-at 7 --steps 12 --dump-path ./demo_watch

test: install
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 tests

# the invisibility matrix with every optimizer for every network (the suite rotates them; ~2x its time)
test-full: install
	MSPROBE_FULL_MATRIX=1 $(PY) -m pytest -q -p no:cacheprovider --durations=25 tests

bench: install
	$(PY) benchmarks/overhead.py

bench-compare: install
	$(PY) benchmarks/compare_scale.py

clean:
	rm -rf $(VENV) demo_dump demo_dump_fp16 demo_compare demo_watch build msprobe/tensors/_stats_kernel.*.so msprobe/tensors/_hotpath.*.so msprobe/format/_npy_files.*.so
