# Two commands do everything on a fresh machine (see README):
#   make demo   capture + report on the built-in trainer (CPU, synthetic data)
#   make test   the whole test suite
PYTHON ?= python3
SHARED ?= ../shared

.PHONY: setup demo test lint check torchrec

# torch is pinned to the local CPU wheel; an unpinned torch would pull GBs of CUDA packages.
setup:
	$(PYTHON) -m pip install -q --disable-pip-version-check torch==2.13.0 -e '.[train,dev,hta,view,dask]'
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
		echo "chromium not installed: browser tests will skip"; }
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		{ [ "$$(id -u)" = 0 ] && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq postgresql >/dev/null) || \
		echo "postgresql not installed: the tuner's PostgreSQL test will skip"; }

# A 2-rank CPU run of the built-in trainer under capture; prints the report's path at the end.
demo: setup
	rm -rf recprof-runs/demo
	recprof capture --out recprof-runs/demo -- torchrun --standalone --nproc_per_node 2 \
		-m recprof.nestpipe --config examples/configs/demo.yaml --out recprof-runs/demo/trainer

# TorchRec too: the tests capture TorchRec's golden DLRM from ../shared/jobs.
# Two pytest-xdist workers: a 2-rank job under torchrun keeps a 2-core machine only ~0.9 cores
# busy on average (imports, rendezvous, timeouts waited out), so two workers finish the suite
# in ~17 min here where one took ~38 (docs/testing.md, "The suite's time"). Tests that must
# not run apart keep together (tests/conftest.py, XDIST_GROUPS). TEST_WORKERS=0 runs it in one
# process.
TEST_WORKERS ?= 2
test: torchrec
	RECPROF_SHARED=$(SHARED) $(PYTHON) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup -p no:benchmark

# ruff, then the layers contract (import-linter, pyproject.toml) and the import-circle check.
lint:
	ruff check .
	lint-imports
	$(PYTHON) tests/import_cycles.py

# Day-to-day: the lint above, then the tests that run no multi-process job (`make test` runs
# them all).
check: lint
	RECPROF_SHARED=$(SHARED) $(PYTHON) -m pytest -q -x -m "not slow and not browser and not netns" \
		--ignore=tests/trace/test_change_detector.py

# TorchRec, pinned for CPU: the tests capture its golden DLRM (../shared/jobs), and
# examples/torchrec_dlrm.py and the trainer-vs-TorchRec benchmarks use it (faiss-cpu: its two-tower
# retrieval example, ../shared/jobs/torchrec_two_tower, indexes its candidates). Its metadata asks for
# the CUDA fbgemm-gpu, so it goes in without dependencies.
torchrec: setup
	$(PYTHON) -m pip install -q --no-deps torchrec==1.8.0
	$(PYTHON) -m pip install -q fbgemm-gpu-cpu==1.8.0 tensordict torchmetrics==1.0.3 tqdm faiss-cpu \
		pyre-extensions iopath
