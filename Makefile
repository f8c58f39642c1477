# The two commands of the README. Both install what they need first (scripts/setup.sh).
.PHONY: demo test setup bench

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/python examples/demo.py

test: setup
	bash scripts/install_test_tools.sh
	.venv/bin/ruff check fastloader tests benchmarks examples scripts
	.venv/bin/ruff format --check fastloader tests benchmarks examples scripts
	.venv/bin/mypy
	.venv/bin/python -m pytest -q

bench: setup
	.venv/bin/python benchmarks/bench_overlap.py
