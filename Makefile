# decent-dp: `make help` lists the targets.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
NPROC   ?= 4
ARGS    ?=
# pytest-xdist processes for `make test` (0: one process); whole files go to one worker,
# so a module's fixtures are built once
TEST_WORKERS ?= 2
PACKED_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install test check-docs test-all test-gpu test-slurm mutate slurm-up slurm-down gpu-check lint format train train-packed train-lm study-workers sweep bench bench-sharded bench-upstream report simulate topo testbed-up testbed-down testbed-run lighthouse clean

help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2}'

install: ## Create .venv and install the package with the experiments, ft (torchft) and dev extras
	python3 -m venv .venv
	$(PIP) install --upgrade pip
	$(PIP) install -e ".[experiments,ft,dev]"

test: ## check-docs, then the fast test suite (no `slow` tests) on TEST_WORKERS=2 processes
	$(PY) -m experiments.report.check_docs
	$(PY) -m pytest -m "not slow" -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

check-docs: ## Every measured figure in README.md and docs/ against its committed data file (--write: ARGS=--write)
	$(PY) -m experiments.report.check_docs $(ARGS)

test-all: ## Every test, `slow` included
	$(PY) -m pytest -q $(ARGS)

test-gpu: ## Only the tests that need CUDA
	$(PY) -m pytest -m gpu -q $(ARGS)

mutate: ## Mutation run (cosmic-ray) of modules against the fast tests that cover them; ARGS="decent_dp/mixing.py ..." (no ARGS: list the modules) -> docs/results/mutate/
	$(PY) -m tests.support.mutate $(ARGS)

test-slurm: ## As root: a one-node SLURM (Debian's packages), sweep, requeue and time-limit tests (~3 min)
	$(PY) -m pytest tests/e2e/test_slurm.py -q $(ARGS)

slurm-up: ## As root: start a one-node SLURM here (tests/support/slurm_cluster.sh); prints SLURM_CONF
	tests/support/slurm_cluster.sh up

slurm-down: ## Stop what slurm-up started
	tests/support/slurm_cluster.sh down

gpu-check: ## On one GPU (< 9 min): a bf16 train run, test-gpu (budgeted from the measured CUDA start), the CUDA bench -> docs/results/gpu.md
	$(PY) -m experiments.bench.gpu_check $(ARGS)

lint: ## ruff (lint + format check) and mypy on decent_dp
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy decent_dp

format: ## Apply ruff's formatter and autofixes
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

train: ## Default job: 4 CPU workers, gloo, digits, one-peer-exp (< 1 min)
	.venv/bin/torchrun --standalone --nproc_per_node=$(NPROC) train.py $(ARGS)

WORKERS ?= 16

train-packed: ## The default job's WORKERS (16) workers packed in one process (engine=packed, no torchrun)
	$(PY) train.py engine=packed engine.workers=$(WORKERS) $(ARGS)

LH_BIND     ?= [::]:29510
LH_REPLICAS ?= 1
LH_JOIN_MS  ?= 90000

lighthouse: ## torchft's lighthouse for fault_tolerance=torchft (LH_BIND=[::]:29510, LH_REPLICAS=1, LH_JOIN_MS between 1x and 2x timeout_s); ARGS=more flags
	.venv/bin/torchft_lighthouse --min_replicas $(LH_REPLICAS) --bind $(LH_BIND) --join_timeout_ms $(LH_JOIN_MS) --heartbeat_timeout_ms 2000 $(ARGS)

LM_DATA := data/stdlib-bpe

train-lm: ## Tiny GPT on the stdlib's own sources (made once in data/stdlib-bpe), 4 CPU workers (< 2 min)
	@test -f $(LM_DATA)/train.bin || $(PY) -m experiments.data.prepare_tokens --stdlib --out $(LM_DATA) --max-bytes 2000000 --vocab-size 1024
	.venv/bin/torchrun --standalone --nproc_per_node=$(NPROC) train.py experiment=lm_quick topology=one-peer-exp $(ARGS)

study-workers: ## The optimizer gap at 4 to 64 packed workers (resumable, hours on a CPU), then its page's data -> docs/results/workers/; ARGS=--lanes 2 ...
	@test -f data/py-bpe-40m/train.bin || $(PY) -m experiments.data.prepare_tokens --input $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("stdlib"))') $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') --out data/py-bpe-40m --max-bytes 40000000 --vocab-size 1024
	$(PY) -m experiments.sweeps.workers $(ARGS)
	$(PY) -m experiments.report.workers

sweep: ## Multirun: complete, ring, one-peer-exp and allreduce on the default dataset
	.venv/bin/torchrun --standalone --nproc_per_node=$(NPROC) train.py -m topology=complete,ring,one-peer-exp,allreduce $(ARGS)

bench: ## Step-time benchmark (local vs torch DDP vs every topology, 2 and 4 processes), then bench-sharded, then packed workers vs processes (PACKED_ARGS=...), then what membership costs a step on the testbed (root; ELASTIC_COST_ARGS=...)
	$(PY) -m experiments.bench.step_time $(ARGS)
	$(PY) -m experiments.bench.sharded_memory $(SHARDED_ARGS)
	$(PY) -m experiments.bench.packed_throughput $(PACKED_ARGS)
	$(PY) -m experiments.bench.elastic_cost --out docs/results/elastic --runs outputs/elastic_cost $(ELASTIC_COST_ARGS)

bench-sharded: ## Peak memory per rank: FSDP2 shards (device_mesh), HSDP and the unsharded wrapper -> docs/results/sharded/bench.json; SHARDED_ARGS=...
	$(PY) -m experiments.bench.sharded_memory $(SHARDED_ARGS)

bench-upstream: ## Step time vs decent-dp 0.2.3 (own venv in .bench/) and torch DDP; ARGS=--profile
	$(PY) -m experiments.bench.upstream $(ARGS)

report: ## report.md + plots for the newest sweep (or DIRS=...)
	$(PY) -m experiments.report $(or $(DIRS),$(shell ls -td multirun/*/*/ 2>/dev/null | head -1)) $(ARGS)

simulate: ## Scale simulation: allreduce vs topologies at 8..1024 workers
	$(PY) -m experiments.network.simulate $(ARGS)

HOSTS   ?= 4
PPH     ?= 1
RATE    ?= 100mbit

testbed-up: ## As root: HOSTS network namespaces on one bridge, links capped at RATE both ways (PPH procs per host)
	$(PY) -m experiments.network.testbed up --hosts $(HOSTS) --procs-per-host $(PPH) --rate $(RATE)

testbed-down: ## Remove everything testbed-up built
	$(PY) -m experiments.network.testbed down

testbed-run: ## train.py on every testbed host (one torchrun each, c10d rendezvous); ARGS=overrides
	$(PY) -m experiments.network.testbed run -- $(ARGS)

topo: ## Topology table: period, spectral gap, contraction (64 workers; ARGS="--world-size 32 --inter ring")
	$(PY) -m decent_dp.topo $(or $(ARGS),--world-size 64)

.PHONY: choose
choose: ## Rank the topologies for a cluster; ARGS="--nodes 2 --procs-per-node 8 --link 25gbit --model resnet50"
	$(PY) -m experiments.network.choose $(or $(ARGS),--help)

clean: ## Remove caches and run outputs (keeps .venv)
	rm -rf outputs multirun wandb .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
