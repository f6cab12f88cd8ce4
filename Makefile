# birder-repro: every target creates .venv first when it is missing.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
ARGS    ?=
# pytest-xdist workers: three share this 2-core machine best (measured on one tree: 462 s on three, 485 s on two,
# the tests waiting on processes they start); --dist loadfile gives each a whole test file, the longest first
WORKERS ?= 3

.PHONY: help install run lint test test-all test-torch tables bench gpu-check gpu-check-lent emulated-setup validate validate-emulated validate-fashion validate-published tune-fashion time-to-accuracy time-to-accuracy-check local-steps diloco-replicas clean clean-failed

# the descriptions start in one column, after the longest target's name
help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{name[NR] = $$1; text[NR] = $$2; if (length($$1) > w) w = length($$1)} \
		END {for (i = 1; i <= NR; i++) printf "  make %-" w "s  %s\n", name[i], text[i]}'

# The install takes about 6.5 GB (torch's CUDA wheel and its libraries): say so before pip runs out of disk.
$(STAMP): pyproject.toml constraints.txt
	@$(PY) -c "import shutil; f = shutil.disk_usage('.').free / 2**30; f < 7 and print(f'birder-repro: WARNING: {f:.1f} GiB free here; the install needs about 6.5 GiB (torch and its libraries)')"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test,integrations]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install the package with its test tools

run: $(STAMP)  ## the quick start: SGDM, 1-bit Adam and Birder on real digits, 2 nodes x 1 process (ARGS= adds overrides)
	$(BIN)/birder-repro -m experiment=quickstart optim=sgdm,onebit_adam,birder $(ARGS)

lint: $(STAMP)  ## ruff (lint and format check) over the tree, mypy on the library (comm, optim, integrations)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint  ## lint, then the fast test suite (the one CI runs), on WORKERS=3 pytest-xdist workers
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile $(ARGS)

test-all: lint  ## lint, then every test, slow ones included
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile -m 'not gpu' $(ARGS)

tables: $(STAMP)  ## build tables/ from every run record under runs/
	$(BIN)/python -m birder_repro.report $(ARGS)

clean-failed: $(STAMP)  ## list the failed runs under runs/ that make tables leaves out; ARGS=--yes removes them
	$(BIN)/python -m birder_repro.report.clean_failed $(ARGS)

bench: $(STAMP)  ## compression / decompression time of the hooks against a copy of the same buffer
	$(BIN)/python -m birder_repro.bench.kernels $(ARGS)

gpu-check: $(STAMP)  ## on a GPU node: kernels, 1-GPU runs of every task, hooks across ranks (DDP/FSDP, fp32/bf16/fp16; NCCL, or 2 ranks on 1 GPU); one table, non-zero on a failure or unusable CUDA
	$(BIN)/python -m birder_repro.gpucheck $(ARGS)

# make test-torch VERSION=2.11.0: the torch versions the package claims (pyproject.toml's floor) are the ones tested.
# A separate venv, .venv-torch-$(VERSION), with that torch from the registry (and the torchvision and Triton it
# pins) and the package's other dependencies at constraints.txt's versions; then TORCH_TESTS, one pytest worker:
# the hooks against their references, the optimizers, the Triton kernels in Triton's interpreter, fp16 with
# GradScaler, a two-node torchrun run stopped and resumed, and a dry run importing no torch.
TORCH_VENV = .venv-torch-$(VERSION)
TORCH_TESTS ?= tests/test_comm_hooks.py tests/test_birder.py tests/test_onebit.py tests/test_optimizers.py \
	tests/test_kernels.py tests/test_gpu_paths.py tests/test_grad_scaler.py tests/test_nonfinite.py \
	tests/test_multinode.py::test_two_node_run_is_one_directory_stops_on_sigint_and_resumes_bit_exactly \
	tests/test_cli.py::test_checking_a_config_and_a_dry_run_import_no_torch
# TORCH_PINS: accelerate (tests/test_grad_scaler.py's Accelerate case) and numpy < 2.4: the Triton interpreter of
# Triton 3.6 (torch 2.11's) turns 1-element arrays into ints, which numpy 2.4 refuses ("only 0-dimensional arrays").
TORCH_PINS ?= accelerate "numpy<2.4"
test-torch:  ## VERSION=2.11.0: a venv with that torch, then the hooks, optimizers, kernels (interpreted), a 2-node run
	@test -n "$(VERSION)" || { echo "make test-torch: say which torch, e.g. make test-torch VERSION=2.11.0"; exit 2; }
	test -x $(TORCH_VENV)/bin/python || $(PY) -m venv $(TORCH_VENV)
	grep -v -E '^(torch|torchvision|torchft)==' constraints.txt > $(TORCH_VENV)/constraints.txt
	$(TORCH_VENV)/bin/pip install -q -c $(TORCH_VENV)/constraints.txt "torch==$(VERSION)" -e . pytest pytest-timeout \
	  $(TORCH_PINS)
	$(TORCH_VENV)/bin/python -c "import torch, triton; print('make test-torch: torch', torch.__version__, 'Triton', triton.__version__)"
	$(TORCH_VENV)/bin/python -m pytest -q -p no:xdist -p no:cacheprovider $(TORCH_TESTS) $(ARGS)

# A lent GPU machine (docs/gpus.md): its image's python and torch, no network, 64 MiB carried. scripts/pack_lent.sh
# (here) packs the project and the few pure-Python dependencies into .lent/site; this runs the quick plan there with
# nothing installed, from .lent so that the checkout's own birder_repro/ (without its tasks/ link) is not imported.
LENT_PY ?= python3
gpu-check-lent:  ## on a lent GPU machine: gpu-check --quick (6 min) with its own python and torch, nothing installed (pack .lent first: scripts/pack_lent.sh)
	@test -d .lent/site || { echo "make gpu-check-lent: no .lent/site: run scripts/pack_lent.sh where the registry is, and carry .lent"; exit 2; }
	cd .lent && PYTHONPATH=$(CURDIR)/.lent/site $(LENT_PY) -m birder_repro.gpucheck --quick --out $(CURDIR)/runs/gpu-check-lent $(ARGS)

validate: $(STAMP)  ## the performance model against the paper, out of sample (2-node fit -> 4 and 8 nodes) and in-sample
	$(BIN)/python -m birder_repro.perf.validate $(ARGS)

validate-published: $(STAMP)  ## the model against every published real-cluster row and claim (Birder, 1-bit Adam, 1-bit LAMB), one protocol
	$(BIN)/python -m birder_repro.perf.published $(ARGS)

# The emulated sweep (cluster=emulated needs root and iproute2): ResNet-50 (tiny, synthetic 64x64 images), SGDM,
# 1-bit Adam and Birder on 1, 2 and 4 nodes of one process, links of 100 and 200 Mbit/s; then each multi-node
# run predicted from the 1-node run of its optimizer. One thread a process: the nodes share this machine's cores.
EMU_RUNS ?= runs/validate-emulated
EMU_ARGS ?= task=resnet50 model.size=tiny data.source=synthetic data.image_size=64 data.num_workers=0 \
	train.batch_size=8 train.steps=40 train.timing_warmup_steps=5 train.eval=false logger=none cluster=emulated \
	optim=sgdm,onebit_adam,birder nodes=1,2,4 cluster.link_mbit=100,200
validate-emulated: $(STAMP)  ## run the emulated sweep (about 12 minutes), then predicted vs measured throughput
	BIRDER_RUNS=$(EMU_RUNS) OMP_NUM_THREADS=1 $(BIN)/birder-repro -m $(EMU_ARGS) $(ARGS)
	$(BIN)/python -m birder_repro.perf.validate --emulated $(EMU_RUNS)

# The paper's claim where it applies (docs/time-to-accuracy.md, "The protocol"; cluster=emulated: root and
# iproute2): time to accuracy on Fashion-MNIST, 2 nodes x 2 processes at 200 Mbit/s, ten methods. Everything the
# protocol fixes in advance (the grids, 12 trials a method; tuning seeds 100 and 101, apart from the field's 0-4;
# the target and budget rules; the load limit; the run order's seed) is in $(TTA_PROTOCOL); the cells are printed
# by birder_repro.report.protocol and .tuning and run by birder_repro.sweep in a recorded random order
# (RUNS/order-<name>.txt), one cell after another, "cell k of N, about T left" before each.
# tune-fashion (about 2.9 h here): the 1-node profiles (three a method), the grid at seed 100 (144 whole runs,
# validation split, links unshaped, each scored by its predicted time to 87 % at 200 Mbit/s), the best two of
# each method at seed 101, one step past every edge pick and those confirmed, then $(TTA_RUNS)/tuned.yaml: the
# choices, the targets (97/98/99 % of the best final validation top-1), the budgets and each step time.
# time-to-accuracy (about 2.3 h here): the field from tuned.yaml, 5 seeds x 10 methods at 2 x 2 and 200 Mbit/s,
# each run whole (time to each target) and twice more, sized to end at each budget (the median method's time to
# the middle target, and a third); then make tables (tables/targets.md: 95 % t intervals, ties, budgets). Dropped
# to fit 4 hours: the 4 x 1 layout and the crossover over links (earlier rounds' results, 2-3 seeds, in the docs).
# The estimates: docs/time-to-accuracy.md, "How long". A cell that fails or diverges is listed at its sweep's end
# and the target goes on (make's leading -).
TTA_RUNS ?= runs/time-to-accuracy
TTA_PROTOCOL ?= conf/tuning/fashion_mnist.yaml
TTA_OPTIMS ?= sgdm,adamw,sgdm_fp16,sgdm_2level,sgdm_bf16_2level,sgdm_powersgd,diloco,diloco_1bit,streaming_diloco,onebit_adam,onebit_adam_precond,birder
# Three 1-node profiles a method; the model takes the one with the median step (perf.advice_profiles.median_profile_record):
# one 60-step DiLoCo profile came out 14-24 % under three more of the same command. About 2 minutes a seed here.
TTA_PROFILE_SEEDS ?= 0,1,2
TTA_CHECK_RUNS ?= runs/time-to-accuracy-check
TTA_SWEEP = $(BIN)/python -m birder_repro.sweep --cli $(BIN)/birder-repro --extra "$(ARGS)"
TTA_CELLS = $(BIN)/python -m birder_repro.report.protocol --protocol $(TTA_PROTOCOL)
TTA_TUNING = $(BIN)/python -m birder_repro.report.tuning --protocol $(TTA_PROTOCOL)
tune-fashion: $(STAMP)  ## tune the Fashion-MNIST field by conf/tuning/fashion_mnist.yaml (about 2.9 h), then write its plan
	@mkdir -p $(TTA_RUNS)/tuning
	@if [ -f $(TTA_RUNS)/profiles/done.txt ]; then echo "[birder-repro] the 1-node profiles were taken before ($(TTA_RUNS)/profiles/done.txt): kept"; else \
	  BIRDER_RUNS=$(TTA_RUNS)/profiles $(BIN)/birder-repro -m experiment=fashion_time_to_accuracy optim=$(TTA_OPTIMS) \
	  nodes=1 cluster.cores_per_node=1 train.steps=60 train.eval=false seed=$(TTA_PROFILE_SEEDS) $(ARGS) \
	  && date > $(TTA_RUNS)/profiles/done.txt; fi
	$(TTA_CELLS) grid > $(TTA_RUNS)/tuning/cells-grid.txt
	-$(TTA_SWEEP) --runs $(TTA_RUNS)/tuning --name grid $(TTA_RUNS)/tuning/cells-grid.txt
	$(TTA_TUNING) --rerun $(TTA_RUNS) > $(TTA_RUNS)/tuning/cells-confirm.txt
	-$(TTA_SWEEP) --runs $(TTA_RUNS)/tuning --name confirm $(TTA_RUNS)/tuning/cells-confirm.txt
	$(TTA_TUNING) --extend $(TTA_RUNS) > $(TTA_RUNS)/tuning/cells-extend.txt
	-$(TTA_SWEEP) --runs $(TTA_RUNS)/tuning --name extend $(TTA_RUNS)/tuning/cells-extend.txt
	$(TTA_TUNING) --rerun $(TTA_RUNS) > $(TTA_RUNS)/tuning/cells-confirm2.txt
	-$(TTA_SWEEP) --runs $(TTA_RUNS)/tuning --name confirm2 $(TTA_RUNS)/tuning/cells-confirm2.txt
	$(TTA_TUNING) --plan $(TTA_RUNS)

time-to-accuracy: $(STAMP)  ## the Fashion-MNIST field from tune-fashion's plan: 5 seeds, whole and budget runs (about 2.3 h), then tables
	@mkdir -p $(TTA_RUNS)/field
	$(TTA_CELLS) field --runs $(TTA_RUNS) > $(TTA_RUNS)/field/cells-field.txt
	-$(TTA_SWEEP) --runs $(TTA_RUNS)/field --name field $(TTA_RUNS)/field/cells-field.txt
	$(BIN)/python -m birder_repro.report

time-to-accuracy-check: $(STAMP)  ## a quick look (about 11 min): SGDM, two-level bf16, DiLoCo, Birder, seed 0, whole and budget runs
	@mkdir -p $(TTA_CHECK_RUNS)
	$(TTA_CELLS) check --runs $(TTA_RUNS) > $(TTA_CHECK_RUNS)/cells-check.txt
	-$(TTA_SWEEP) --runs $(TTA_CHECK_RUNS) --name check $(TTA_CHECK_RUNS)/cells-check.txt
	$(BIN)/python -m birder_repro.report --runs $(TTA_CHECK_RUNS) --out $(TTA_CHECK_RUNS)/tables --figures $(TTA_CHECK_RUNS)/figures

# The local-step methods where they should win (docs/time-to-accuracy.md, "Local steps over slow links";
# cluster=emulated): DiLoCo, Streaming DiLoCo, the 1-bit DiLoCo, Birder and the two-level bf16 all-reduce at the
# field's 2 x 2, whole runs with tune-fashion's picks (the recipes' values without a plan, said), the field's 5
# seeds, over the protocol's local_steps.links_mbit (25 and 100 Mbit/s: about 1.8 hours estimated; 10 and 50
# were dropped to stay under 2 hours, LOCAL_LINKS=10,25,50,100 runs them too, about 4.3 hours), in a recorded
# random order; then per link and target each method against DiLoCo and Birder, 95 % t intervals, "tie" where
# they overlap ($(LOCAL_RUNS)/tables/local_steps.md). LOCAL_METHODS, LOCAL_SEEDS narrow it (a smoke run).
LOCAL_RUNS ?= runs/local-steps
LOCAL_LINKS ?=
LOCAL_METHODS ?=
LOCAL_SEEDS ?=
LOCAL_NARROW = $(if $(LOCAL_METHODS),--methods $(LOCAL_METHODS)) $(if $(LOCAL_SEEDS),--seeds $(LOCAL_SEEDS))
local-steps: $(STAMP)  ## DiLoCo, Streaming and 1-bit DiLoCo, Birder, two-level bf16 at 25 and 100 Mbit/s, 5 seeds (about 1.8 h), then their table
	@mkdir -p $(LOCAL_RUNS)
	$(TTA_CELLS) local-steps --runs $(TTA_RUNS) $(if $(LOCAL_LINKS),--links $(LOCAL_LINKS)) $(LOCAL_NARROW) \
	  > $(LOCAL_RUNS)/cells-local-steps.txt
	-$(TTA_SWEEP) --runs $(LOCAL_RUNS) --name local-steps $(LOCAL_RUNS)/cells-local-steps.txt
	$(BIN)/python -m birder_repro.report.local_steps --protocol $(TTA_PROTOCOL) --runs $(LOCAL_RUNS) \
	  --out $(LOCAL_RUNS)/tables/local_steps.md

# DiLoCo's steps against its replicas (docs/time-to-accuracy.md, "DiLoCo's steps against its replicas";
# cluster=emulated, links unshaped): DiLoCo, the 1-bit DiLoCo and Birder on 2, 4 and 8 nodes of one process at the
# field's global batch of 256, the field's 5 seeds, whole runs (about 60 minutes estimated); then the steps to each
# target and the multiple of Birder's ($(REPLICA_RUNS)/tables/diloco_replicas.md), which perf.paper_scale reads
# from $(REPLICA_RUNS). REPLICA_NODES, LOCAL_METHODS, LOCAL_SEEDS narrow it (a smoke run).
REPLICA_RUNS ?= runs/diloco-replicas
REPLICA_NODES ?=
diloco-replicas: $(STAMP)  ## DiLoCo, 1-bit DiLoCo, Birder on 2, 4, 8 nodes at one global batch, 5 seeds (about 60 min): steps to the targets
	@mkdir -p $(REPLICA_RUNS)
	$(TTA_CELLS) replicas --runs $(TTA_RUNS) $(if $(REPLICA_NODES),--nodes $(REPLICA_NODES)) $(LOCAL_NARROW) \
	  > $(REPLICA_RUNS)/cells-replicas.txt
	-$(TTA_SWEEP) --runs $(REPLICA_RUNS) --name replicas $(REPLICA_RUNS)/cells-replicas.txt
	$(BIN)/python -m birder_repro.report.local_steps --protocol $(TTA_PROTOCOL) --replicas $(REPLICA_RUNS) \
	  --out $(REPLICA_RUNS)/tables/diloco_replicas.md

# Runs made after the model was settled, at a link or layout used for nothing else (docs/time-to-accuracy.md: the
# 300 Mbit/s runs that checked mode=advise), reported apart where the folder exists.
TTA_HELD_OUT ?= runs/advise-check
validate-fashion: $(STAMP)  ## the model against every multi-node run of the Fashion-MNIST field and crossover, out of sample
	$(BIN)/python -m birder_repro.report.model_error --runs $(TTA_RUNS) $(if $(wildcard $(TTA_HELD_OUT)),--held-out $(TTA_HELD_OUT))

emulated-setup:  ## install iproute2 (ip, tc) for cluster=emulated where it is missing (needs root)
	@command -v ip >/dev/null && command -v tc >/dev/null && echo "iproute2 is installed" || \
	  (apt-get update -q && apt-get install -y -q iproute2)

clean:  ## remove the virtual environment and caches (runs/ stays)
	rm -rf $(VENV) .pytest_cache build *.egg-info
