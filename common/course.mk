# common/course.mk - the one build fragment every folder includes.
#
# A folder's Makefile sets PROGRAMS (binaries, each built from NAME.c),
# optionally CU_SRCS (CUDA files linked into every program of the folder in
# a CUDA build), then includes this file. It finds the tools, chooses CPU
# or CUDA, and builds. Variables you can set: CUDA=0|1|emu (default: 1 when
# nvcc, NCCL and cuBLAS are found; emu: the emulated GPU of emu/, which
# needs only g++), ASAN=1 (build with sanitizers),
# CUDA_HOME, NCCL_HOME, CUDA_ARCH (e.g. sm_90).

COURSE_ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST))/..)))
COMMON := $(COURSE_ROOT)/common

include $(COMMON)/detect.mk

# GPU architecture: the GPU in this machine if there is one, else sm_90,
# which proves the code compiles for a modern GPU.
CUDA_ARCH ?= $(if $(HAVE_GPU),native,sm_90)
NVCC_ARCH := $(if $(filter native,$(CUDA_ARCH)),-arch=native,-gencode arch=compute_$(subst sm_,,$(CUDA_ARCH)),code=$(CUDA_ARCH))

# ---------------------------------------------------------------- flags
CC ?= cc
CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -I$(COMMON) -pthread
LDLIBS := -lm -pthread
NVCCFLAGS := -O2 -g -std=c++17 -I$(COMMON) $(if $(NCCL_INC),-I$(NCCL_INC)) $(NVCC_ARCH) -Xcompiler -Wall,-Wextra -DCOURSE_CUDA
ifeq ($(HAVE_OPENMP),yes)
CFLAGS += -fopenmp
LDLIBS += -fopenmp
endif
# MPI's own C++ bindings are not wanted where the emulated GPU compiles as C++.
ifeq ($(HAVE_MPI),yes)
CFLAGS += -DCOURSE_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX $(MPI_CFLAGS)
LDLIBS += $(MPI_LIBS)
endif
ifeq ($(ASAN),1)
CFLAGS := $(filter-out -O2,$(CFLAGS)) -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDLIBS += -fsanitize=address,undefined
endif
ifeq ($(CUDA),1)
CFLAGS += -DCOURSE_CUDA -I$(CUDA_HOME)/include -I$(NCCL_INC)
LDLIBS += -L$(CUDA_LIBDIR) -L$(NCCL_LIB) -L$(CUBLAS_LIB) -lcublas $(NCCL_LINK) -lcudart -lstdc++ \
          -Wl,-rpath,$(CUDA_LIBDIR) -Wl,-rpath,$(NCCL_LIB)
CU_OBJS := $(patsubst %.cu,build/%.o,$(notdir $(CU_SRCS)))
else ifeq ($(CUDA),emu)
# The emulated GPU: the same sources against emu/include's drop-in headers,
# .cu files rewritten by cu2emu (<<<...>>> and __shared__) and compiled by
# g++ as nvcc would compile them, linked with emu's library.
EMU := $(COURSE_ROOT)/emu
EMU_LIB := $(EMU)/build/$(if $(filter 1,$(ASAN)),asan,plain)/libcudaemu.a
CU2EMU := $(EMU)/build/cu2emu
CXX ?= g++
# Outside ASan builds the compiler calls the emulator's race checker at every
# load and store of a .cu file (ThreadSanitizer's hooks; emu/src/race.c).
EMU_RACE_FLAGS := $(if $(filter 1,$(ASAN)),,-fsanitize=thread --param tsan-instrument-func-entry-exit=0)
CXXFLAGS := $(filter-out -std=c11,$(CFLAGS)) -std=c++17 -DCOURSE_CUDA -DCOURSE_EMU -D__CUDACC__ -I$(EMU)/include \
            -include cuda_runtime.h $(EMU_RACE_FLAGS)
CFLAGS += -DCOURSE_CUDA -DCOURSE_EMU -I$(EMU)/include
LDLIBS += $(EMU_LIB) -lstdc++ -lrt -ldl
CU_OBJS := $(patsubst %.cu,build/%.o,$(notdir $(CU_SRCS)))
else
CU_OBJS :=
endif

# Rebuild everything when the build mode changes (CPU <-> CUDA <-> ASAN).
BUILD_STAMP := build/mode-$(CUDA)-$(ASAN)-$(CUDA_ARCH)$(if $(HAVE_MPI),-mpi)
$(shell [ -f $(BUILD_STAMP) ] || { rm -rf build $(PROGRAMS); mkdir -p build; touch $(BUILD_STAMP); })

# ---------------------------------------------------------------- rules
.PHONY: all clean
all: $(PROGRAMS)

build/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

vpath %.cu $(sort $(dir $(CU_SRCS)))
ifeq ($(CUDA),emu)
# CUDA code in a header beside the .cu (gpt/gpt_cuda_cp.cuh) is rewritten
# too, into build/, where the rewritten .cu finds it first.
build/%.o: %.cu $(CU2EMU) $(EMU_LIB) $(wildcard *.cuh)
	@mkdir -p $(dir $@)
	$(CU2EMU) $< build/$*.emu.cpp
	@for h in $(wildcard $(dir $<)*.cuh); do $(CU2EMU) $$h build/$$(basename $$h) || exit 1; done
	$(CXX) $(CXXFLAGS) -I$(dir $<) -MMD -MP -c build/$*.emu.cpp -o $@

$(EMU_LIB) $(CU2EMU): $(wildcard $(EMU)/src/*.c $(EMU)/src/*.h $(EMU)/include/*.h $(EMU)/tools/*.c)
	@$(MAKE) --no-print-directory -C $(EMU) ASAN=$(ASAN)
else
build/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC_PATH) $(NVCCFLAGS) -MMD -MP -c $< -o $@
endif

$(PROGRAMS): %: build/%.o $(CU_OBJS) $(EXTRA_OBJS) $(if $(filter emu,$(CUDA)),$(EMU_LIB))
	$(CC) $(filter-out %.a,$^) -o $@ $(LDLIBS)

clean:
	rm -rf build $(PROGRAMS)

-include $(wildcard build/*.d build/*/*.d)
