# The two commands of the README. Both install what they need first (scripts/setup.sh).
# The tests run on 2 processes (pytest-xdist), one test file each: most tests wait on child processes, and a
# file's module fixtures (a Ray cluster, an S3 server, the torchrun runs) are then built once.
.PHONY: demo test setup bench docs fuzz

# The documentation site (docs/, Sphinx): warnings are errors (-W, all of them listed: --keep-going),
# every cross-reference is checked (-n), and -E rereads every page so none of its warnings is skipped.
SPHINX_BUILD = .venv/bin/sphinx-build -E -W --keep-going -n -b html docs docs/_build/html

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/python examples/demo.py

test: setup
	bash scripts/install_test_tools.sh
	bash scripts/setup_streaming_env.sh
	.venv/bin/ruff check fastloader tests benchmarks examples scripts docs/conf.py
	.venv/bin/ruff format --check fastloader tests benchmarks examples scripts docs/conf.py
	.venv/bin/mypy
	.venv/bin/lint-imports
	$(SPHINX_BUILD)
	.venv/bin/python -m pytest -q -n 2 --dist loadfile

# The fuzz oracle (tests/oracle) over N more drawn loader configurations than make test's fixed seeds:
# make fuzz N=500 (START=1000 by default; a failure names its seed: FASTLOADER_FUZZ_SEEDS=SEED:1 reruns it).
# Then the JPEG extension under ASan and UBSan, fed 8 x N mutated JPEGs (scripts/fuzz_jpeg.py; seed START).
N ?= 200
START ?= 1000
fuzz: setup
	FASTLOADER_FUZZ_SEEDS=$(START):$(N) .venv/bin/python -m pytest -q -n 2 tests/oracle -k drawn_configuration
	.venv/bin/python scripts/fuzz_jpeg.py $$(( 8 * $(N) )) --seed $(START)

docs: setup
	$(SPHINX_BUILD)

bench: setup
	.venv/bin/python benchmarks/bench_overlap.py
