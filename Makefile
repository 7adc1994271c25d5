# Set-up and checks. `make test` from a fresh clone creates .venv, installs the project with
# the pinned torch, then runs lint and the test suite.
PYTHON ?= python3
VENV ?= .venv
# CPU wheel by default; override for another build, e.g. `make setup TORCH_SPEC=torch==2.5.1`.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest-xdist workers, one a core, each test file whole on one worker (its module fixtures
# built once); PYTEST_WORKERS=0 runs the tests in this process, one after another.
PYTEST_WORKERS ?= auto
# Named corpora are found through WTNMT_DATA (yours, else ../shared/data when it is beside the
# checkout), else downloaded; the demo and the tests on real corpora read it (empty: unset).
WTNMT_DATA ?= $(if $(wildcard ../shared/data/tatoeba-deu-eng),$(abspath ../shared/data),)
PYTEST_ARGS := -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
PYTEST := WTNMT_DATA="$(WTNMT_DATA)" $(BIN)/python -m pytest $(PYTEST_ARGS)

.PHONY: setup test test-slow test-isa test-avx2 lint format demo bench clean

setup: $(STAMP)

# --no-build-isolation: setup.py compiles the native engine against the torch installed first
# (pip's isolated build would fetch another torch, CUDA's on Linux)
$(STAMP): pyproject.toml setup.py Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install "$(TORCH_SPEC)" "setuptools>=77" wheel
	$(BIN)/python -m pip install --no-build-isolation -e ".[dev]" "$(TORCH_SPEC)"
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check src tests benchmarks setup.py
	$(BIN)/ruff format --check src tests benchmarks setup.py

test: lint
	$(PYTEST)

# The end-to-end tests (worker processes, DDP, the experiment runner, overfitting, the serve
# command, real servers with slow clients, the kill soak): minutes, where `make test` is quick.
test-slow: setup
	$(PYTEST) -m slow

# The numerics-sensitive tests (the model, training, decoding, int8 and ONNX tests) again
# under each instruction set this CPU can emulate downward (ATEN_CPU_CAPABILITY,
# ONEDNN_MAX_CPU_ISA and FBGEMM_ENABLE_INSTRUCTIONS: SSE4.1, AVX2, AVX2 with AVX-VNNI, AVX-512,
# AVX-512 with VNNI, with bf16, AMX), so that a newer CPU checks the kernels older ones run;
# the CPU's own level is the one `make test` ran. Not tests/test_onnx.py: ONNX Runtime picks its
# kernels from the CPU alone (these variables do not reach it), its int8 checked by an oracle
# that holds on every CPU (tests/int8_oracle.py); the PyTorch side it compares with is rerun here.
# ISA=avx2 runs one level (docs/ARCHITECTURE.md, "Tests on every CPU"). The learning-rate
# schedule and the clock, test_schedule.py, are no kernel's: not rerun.
NUMERIC_TESTS := tests/test_model.py tests/test_model_cache.py tests/test_branched.py \
	tests/test_branch_weights.py \
	tests/test_dropout.py tests/test_loss.py tests/test_train.py tests/test_resume.py \
	tests/test_decode.py tests/test_translate.py tests/test_length_penalty.py \
	tests/test_quantize.py tests/test_int8_kernels.py tests/test_prune.py tests/test_precision.py \
	tests/test_native_int8.py
ISA ?=
test-isa: setup
	WTNMT_DATA="$(WTNMT_DATA)" $(BIN)/python tests/isa_ladder.py $(if $(ISA),--only $(ISA)) -- \
		$(PYTEST_ARGS) $(NUMERIC_TESTS)

# The AVX2 level alone (what CI runs beside `make test`).
test-avx2:
	$(MAKE) test-isa ISA=avx2

format: setup
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

# The main job: Tatoeba en→de, 12 minutes of training, evaluation.
MINUTES ?= 12

demo: setup
	WTNMT_DATA="$(WTNMT_DATA)" $(BIN)/wtnmt demo --minutes $(MINUTES)

bench: setup
	$(BIN)/python benchmarks/step_time.py
	$(BIN)/python benchmarks/train_speed.py
	$(BIN)/python benchmarks/decode_speed.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
