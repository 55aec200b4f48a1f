# gpt/gpt.mk - included by the folders that build the GPT of chapters 08-11
# (after common/course.mk): the model's headers and CPU flags, and in a CUDA
# or emulated-GPU build the GPU model (gpt_cuda.mk).
#
# The model's headers are found here. On the CPU its matrix products call
# OpenBLAS when it is installed, and its element-wise loops are compiled
# for this CPU: both below.
GPT_DIR := $(COURSE_ROOT)/gpt
CFLAGS += -I$(GPT_DIR)
include $(GPT_DIR)/gpt_cuda.mk

# OpenBLAS for the CPU matrix products (see 08_gpt_wikitext/README.md, "Speed"):
# found when a program including <cblas.h> links with -lopenblas. BLAS=0
# turns it off; gpt.h then uses its own blocked kernel.
# Debian/Ubuntu: apt-get install libopenblas-dev
HASH := \#
ifneq ($(BLAS),0)
HAVE_OPENBLAS := $(shell printf '$(HASH)include <cblas.h>\nint main(void){openblas_set_num_threads(1);return 0;}\n' | \
                   $(CC) -x c - -lopenblas -o /dev/null 2>/dev/null && echo yes)
endif
ifeq ($(HAVE_OPENBLAS),yes)
$(info [build] OpenBLAS: found (cblas.h and libopenblas): CPU matrix products use sgemm)
CFLAGS += -DCOURSE_BLAS
LDLIBS += -lopenblas
else
$(info [build] OpenBLAS: not found$(if $(filter 0,$(BLAS)), (BLAS=0)) (need cblas.h and libopenblas.so, apt-get install libopenblas-dev): CPU matrix products use the blocked C kernel)
endif

# Without OpenMP the #pragma omp lines are ignored: the code runs on one
# thread, and -fopenmp-simd still vectorises the `omp simd` loops.
ifneq ($(HAVE_OPENMP),yes)
CFLAGS += -fopenmp-simd
endif

# The element-wise layers (GELU, softmax, LayerNorm, AdamW) are loops marked
# `omp simd` that the compiler vectorises: -march=native lets it use this
# CPU's widest vectors (AVX-512 here: 16 floats at a time), and
# -fno-trapping-math lets it turn the clamps in gpt_expf_fast into vector
# selects. Together they make those layers 5-20x faster. -fno-math-errno lets
# it use the vector square root in AdamW: C's sqrt must set errno for a
# negative number, a side effect no vector instruction has, and without
# the flag AdamW stays one number at a time (twice as slow; AdamW's square
# roots never see a negative number, and the results are the same bits).
# NATIVE=0 builds a binary that runs on any x86-64 (for copying to another machine).
ifneq ($(NATIVE),0)
ifneq ($(ASAN),1)
HAVE_MARCH_NATIVE := $(shell printf 'int main(void){return 0;}' | $(CC) -march=native -x c - -o /dev/null 2>/dev/null && echo yes)
CPU_FLAGS := -fno-trapping-math -fno-math-errno $(if $(HAVE_MARCH_NATIVE),-march=native)
CFLAGS += $(CPU_FLAGS)
endif
endif

# Rebuild when OpenBLAS or the CPU flags change.
NO_SPACE :=
BLAS_STAMP := build/blas-$(if $(HAVE_OPENBLAS),yes,no)-cpu$(subst $(NO_SPACE) $(NO_SPACE),,$(CPU_FLAGS))
$(shell mkdir -p build; [ -f $(BLAS_STAMP) ] || { rm -f build/blas-* build/*.o $(PROGRAMS); touch $(BLAS_STAMP); })
