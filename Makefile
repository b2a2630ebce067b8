# Two commands do everything on a fresh machine (see README):
#   make demo   capture + report on the built-in trainer (CPU, synthetic data)
#   make test   the whole test suite
PYTHON ?= python3
SHARED ?= ../shared

.PHONY: setup demo test lint

# torch is pinned to the local CPU wheel; an unpinned torch would pull GBs of CUDA packages.
setup:
	$(PYTHON) -m pip install -q --disable-pip-version-check torch==2.13.0 -e '.[train,dev]'
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
		echo "chromium not installed: browser tests will skip"; }

demo: setup
	recprof analyze $(SHARED)/traces/torchrec_pr1460/trace/sst_long_a2a_optimizer --json reports/demo-analysis.json

test: setup
	RECPROF_SHARED=$(SHARED) $(PYTHON) -m pytest -q -ra

lint:
	ruff check .
