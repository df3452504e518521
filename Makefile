# The README's two commands. Both install the Debian packages they lack,
# build with Meson, then run. Everything else is in meson.build.
BUILD      ?= build
TEST_BUILD ?= build-test
VALGRIND_BUILD ?= build-valgrind
PARTITA    := $(BUILD)/cli/partita

DEBIAN_PACKAGES := meson ninja-build pkg-config gcc libjansson-dev \
                   libglpk-dev gnuplot-nox libcmocka-dev valgrind \
                   libopenmpi-dev openmpi-bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build demo test bench clean

all: build

# Installs only what is missing, so a second run costs nothing.
deps:
	@missing=""; for package in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$package 2>/dev/null | \
	    grep -q "install ok installed" || missing="$$missing $$package"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(BUILD)/build.ninja:
	meson setup $(BUILD) -Dbuildtype=release

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

# The main job: plan GPT-2 XL (gbs 64) on the FASOP paper's heterogeneous
# cluster (1 A100 node + 7 A10 nodes), then estimate the chosen plan and
# draw its estimated timeline. Then a short real training run: GPT-2 124M
# on the GPU where one is present (the cuda backend), else a toy plan on
# the CPU reference backend, from the bundled corpus, and its report.
# (The chosen 32-GPU plan needs 32 GPUs of those types to run.)
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)

demo: build
	$(PARTITA) plan --cluster hetero --model gpt2-xl --gbs 64 -o plan.json
	$(PARTITA) estimate plan.json
	$(PARTITA) report plan.json -o demo-out/plan-report
	$(PARTITA) prep data/corpus.txt -o demo-out/corpus
ifeq ($(HAVE_GPU),yes)
	$(PARTITA) exec docs/examples/plan-gpt2-124m-1gpu.json \
	  --data demo-out/corpus --backend cuda --iters 30 --log-interval 10 \
	  -o demo-out/run.json
	$(PARTITA) report docs/examples/plan-gpt2-124m-1gpu.json demo-out/run.json \
	  -o demo-out/run-report
	@echo "# planned, estimated, trained GPT-2 124M on the GPU, reports in demo-out/"
else
	$(PARTITA) exec docs/examples/plan-tiny-cpu.json --data demo-out/corpus \
	  --backend cpu --iters 30 --log-interval 10 -o demo-out/run.json
	$(PARTITA) report docs/examples/plan-tiny-cpu.json demo-out/run.json \
	  -o demo-out/run-report
	@echo "# no GPU here: planned, estimated, trained a toy plan on the CPU, reports in demo-out/"
endif

# Every test, built with AddressSanitizer and UndefinedBehaviorSanitizer
# (the CUDA backend is compiled too when nvcc is there; its GPU tests skip
# without a GPU); then an optimised build without CUDA (valgrind cannot
# follow the CUDA runtime), which also catches the warnings only -O2
# shows, and whose planner end-to-end cases run under valgrind.
test: deps
	@[ -f $(TEST_BUILD)/build.ninja ] || \
	  meson setup $(TEST_BUILD) -Dbuildtype=debug -Db_sanitize=address,undefined
	@[ -f $(VALGRIND_BUILD)/build.ninja ] || \
	  meson setup $(VALGRIND_BUILD) -Dbuildtype=debugoptimized -Dcuda=disabled
	ninja -C $(TEST_BUILD)
	ninja -C $(VALGRIND_BUILD)
	@status=0; meson test -C $(TEST_BUILD) --print-errorlogs \
	  --num-processes 2 || status=$$?; \
	meson test -C $(VALGRIND_BUILD) --suite valgrind --print-errorlogs \
	  --num-processes 2 || status=$$?; \
	.ci/count-tests $(TEST_BUILD)/meson-logs/testlog.json \
	  $(VALGRIND_BUILD)/meson-logs/testlog.json; \
	exit $$status

bench: build
	$(BUILD)/bench/plan_speed

clean:
	rm -rf $(BUILD) $(TEST_BUILD) $(VALGRIND_BUILD)
