# The course's top-level Makefile. `make help` lists what it can do.
#
# Every chapter folder NN_name/ has its own small Makefile that includes
# common/course.mk, so `cd NN_name && make NN_name && ./NN_name` works too.

COMMON := $(CURDIR)/common
include common/detect.mk

CHAPTERS := $(patsubst %/Makefile,%,$(sort $(wildcard [0-9][0-9]_*/Makefile)))
TOOLS := $(if $(wildcard tools/Makefile),tools)
# The GPT chapters: those whose Makefile includes gpt/gpt.mk.
GPT_CHAPTERS := $(patsubst %/Makefile,%,$(shell grep -l 'gpt/gpt\.mk' $(addsuffix /Makefile,$(CHAPTERS))))

.PHONY: all help test asan bench bench-gpt gpu-check plots speedup clean data diffs $(CHAPTERS) tools unit-tests

# The GPU model goes first: nvcc takes two minutes over gpt/gpt_cuda.cu on
# one core (cicc, the device compiler, most of it), and under make -j the
# other chapters build beside it instead of after it.
all: $(if $(GPT_CHAPTERS),gpt-object) $(CHAPTERS) $(TOOLS)

# The emulated GPU's library is built once, before the folders that link
# it: each folder would otherwise build it too, and under make -j two such
# builds at once write the same files.
ifeq ($(CUDA),emu)
$(CHAPTERS) tools unit-tests gpt-object: | emu-library
.PHONY: emu-library
emu-library:
	@$(MAKE) --no-print-directory -C emu ASAN=$(ASAN)
endif

# Chapters 05-11 build tools/ddprun too (their programs are started with
# it): under make -j two of them would build it at once, into the same
# files. So the launcher is built first.
$(CHAPTERS) unit-tests: | $(TOOLS)

# The GPU model (gpt/gpt_cuda.cu) is compiled once, in gpt/build/, for the
# GPT chapters (those whose Makefile includes gpt/gpt.mk) and the unit tests
# that link it (gpt/gpt_cuda.mk): it is made first, for the same reason.
# The other chapters never wait for it (`make 04_ddp_spawn` compiles no GPT).
$(GPT_CHAPTERS) unit-tests: | gpt-object
.PHONY: gpt-object
gpt-object:
	@$(MAKE) --no-print-directory -C gpt object

# `make 04_ddp_spawn` here builds 04_ddp_spawn/04_ddp_spawn; ./04_ddp_spawn is
# the folder, so the last line says how to run the program from here.
$(CHAPTERS) tools:
	@$(MAKE) --no-print-directory -C $@
	@$(if $(filter $@,$(filter-out tools,$(MAKECMDGOALS))),echo "built $@/$@; run it from here with ./$@/$@ (or: cd $@ && ./$@)")

unit-tests:
	@$(MAKE) --no-print-directory -C tests

# The test suite: builds everything, then runs tests/run.sh, which ends with
# "N passed, N failed, N skipped".
test: all unit-tests
	@tests/run.sh $(TESTS)

# A CPU build with AddressSanitizer and UndefinedBehaviorSanitizer, then the
# tests against it. A later plain `make` rebuilds without the sanitizers.
# Leak checking is off: GCC 12's LeakSanitizer can deadlock at exit in a
# child forked from a process with threads (spawn forks while the store's
# thread runs), and a hung test helps nobody.
asan:
	@$(MAKE) --no-print-directory ASAN=1 all unit-tests
	@ASAN=1 ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 tests/run.sh $(TESTS)

# Fuzzing (tests/fuzz/README.md): every parser and the store's server under
# libFuzzer with ASan and UBSan, FUZZ_SECONDS each (FUZZ_TARGETS: some of
# them). Needs clang's libFuzzer.
FUZZ_SECONDS ?= 180
.PHONY: fuzz
fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash tests/fuzz/run.sh $(FUZZ_TARGETS)

BENCHES := $(wildcard bench/*.sh)
bench: all
	@if [ -z "$(BENCHES)" ]; then echo "no benchmarks yet"; fi
	@for b in $(BENCHES); do bash $$b || exit 1; done

# The GPT on a GPU (chapter 08, part 2): tokens/s, step-time split, MFU,
# peak memory. Says so and does nothing where there is no GPU.
bench-gpt: all unit-tests
	@bash bench/gpt_gpu.sh

# On a machine with a real GPU: every test with its GPU cases, then
# bench-gpt, and one report under runs/gpu-check/ (tools/gpu_check.sh).
gpu-check:
	@bash tools/gpu_check.sh

speedup: all
	@bash tools/speedup.sh

plots: all
	@bash plots/make_plots.sh

data:
	@bash tools/get_wikitext.sh

# "Choosing a layout" (gpt/README.md): the planner (gpt/plan.h) over GPT-2's
# four sizes on 8, 64 and 512 GPUs of 80 GB; no GPU needed.
.PHONY: plan-layouts
plan-layouts: tools
	@./tools/plan_layouts

# Read the diff first: chapters 04 to 07 train with one text, so each
# chapter's main file differs from the one before by that chapter's idea
# alone (01 -> 04 data parallelism, 04 -> 05 a launcher, 05 -> 06 snapshots
# and restarts, 06 -> 07 many nodes); chapters 09-11 are 08's training
# program plus theirs (08 -> 09 sharding, 08 -> 10 tensor parallelism,
# 08 -> 11 pipeline parallelism). diff exits 1 when files differ; only its
# 2 (trouble) fails the target.
DIFFS := 01_single_gpu/01_single_gpu.c:04_ddp_spawn/04_ddp_spawn.c \
         04_ddp_spawn/04_ddp_spawn.c:05_env_launch/05_env_launch.c \
         05_env_launch/05_env_launch.c:06_snapshot_resume/06_snapshot_resume.c \
         06_snapshot_resume/06_snapshot_resume.c:07_multinode/07_multinode.c \
         08_gpt_wikitext/08_gpt_wikitext.c:09_zero_fsdp/09_zero_fsdp.c \
         08_gpt_wikitext/08_gpt_wikitext.c:10_tensor_parallel/10_tensor_parallel.c \
         08_gpt_wikitext/08_gpt_wikitext.c:11_pipeline_parallel/11_pipeline_parallel.c \
         08_gpt_wikitext/08_gpt_wikitext.c:12_context_parallel/12_context_parallel.c \
         08_gpt_wikitext/08_gpt_wikitext.c:13_expert_parallel/13_expert_parallel.c \
         11_pipeline_parallel/11_pipeline_parallel.c:14_five_dimensions/14_five_dimensions.c
diffs:
	@for pair in $(DIFFS); do \
	    old=$${pair%%:*}; new=$${pair##*:}; \
	    diff -u --label "$$old" --label "$$new" "$$old" "$$new"; status=$$?; \
	    if [ $$status -gt 128 ]; then exit 0; fi;   # a pager or head closed the pipe \
	    if [ $$status -gt 1 ]; then exit 2; fi; \
	done

# One classroom exercise: build its check with your file (SOLUTION=1: with
# the reference solution) and run it. EX=NN/name, e.g. EX=03/ring_allreduce.
.PHONY: check-exercise
check-exercise:
	@bash tools/check_exercise.sh "$(EX)" $(if $(filter 1,$(SOLUTION)),--solution)

clean:
	@for d in $(CHAPTERS) $(TOOLS) gpt tests tests/emu emu; do $(MAKE) --no-print-directory -C $$d clean; done
	rm -rf runs build */exercises/build tests/fuzz/build

help:
	@echo "targets:"
	@echo "  make              build every chapter and tool (CUDA=0: CPU only; CUDA=emu: the emulated GPU of emu/; a mode given sticks until make clean)"
	@echo "  make NN_name      build one chapter, e.g. make 01_single_gpu"
	@echo "  make test         build, then run all tests (ends with 'N passed, N failed, N skipped')"
	@echo "  make asan         CPU build with AddressSanitizer + UBSan, then the tests"
	@echo "  make fuzz         fuzz every parser and the store, FUZZ_SECONDS each (default 180; needs clang)"
	@echo "  make bench        benchmarks: tables on the terminal, CSV under runs/"
	@echo "  make bench-gpt    chapter 08 on a GPU: tokens/s, MFU, memory (needs a GPU)"
	@echo "  make plan-layouts the planner's table of GPT-2 layouts on 8, 64, 512 GPUs (gpt/README.md, choosing a layout)"
	@echo "  make gpu-check    on a real GPU: every test with its GPU cases, bench-gpt, a report in runs/gpu-check/"
	@echo "  make speedup      measure speedup vs number of ranks: 1 rank (the baseline) vs DDP, median and range (SPEEDUP_CHAPTER=04: chapter 04, spawned; default 05)"
	@echo "  make plots        run missing measurements, draw gnuplot figures (PNG) under runs/plots/"
	@echo "  make data         download WikiText-2 for chapter 08 (if ../shared/data is absent)"
	@echo "  make diffs        chapters 01->04->05->06->07, then 08->09, 08->10 and 08->11, as diffs: read the diff first"
	@echo "  make check-exercise EX=NN/name [SOLUTION=1]   check a classroom exercise, e.g. EX=03/ring_allreduce"
	@echo "  make clean        remove builds and runs/"
	@echo "chapters:"
	@for c in $(CHAPTERS); do printf '  %-20s %s\n' $$c "$$(sed -n 's/^# *[0-9]*_[a-z0-9_]*: *//p;q' $$c/Makefile)"; done
