# common/detect.mk - find the tools once per make invocation and choose the build mode.
# Included by common/course.mk and by the top-level Makefile; results are exported to sub-makes.

# ---------------------------------------------------------------- detection
# Look for the headers and the libraries themselves, never for a package
# name: package names differ between distributions and match the wrong thing.
ifndef COURSE_DETECTED
NVCC_PATH := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/nvcc /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= $(if $(NVCC_PATH),$(abspath $(dir $(firstword $(NVCC_PATH)))/..),/usr/local/cuda)
CUDA_LIBDIR := $(firstword $(dir $(wildcard $(CUDA_HOME)/lib64/libcudart.so $(CUDA_HOME)/lib/libcudart.so $(CUDA_HOME)/targets/x86_64-linux/lib/libcudart.so)))
NCCL_INC := $(firstword $(dir $(wildcard $(NCCL_HOME)/include/nccl.h $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h)))
# No system NCCL? PyTorch's machines often carry one inside a Python package
# (pip's nvidia-nccl-cu12/13): use it, as NCCL_HOME=<its folder> would.
ifeq ($(NCCL_INC)$(NCCL_HOME),)
NCCL_HOME := $(shell python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
NCCL_INC := $(firstword $(dir $(wildcard $(NCCL_HOME)/include/nccl.h)))
NCCL_FROM_PYTHON := $(if $(NCCL_INC),yes)
endif
NCCL_LIB := $(firstword $(dir $(wildcard $(foreach d,$(NCCL_HOME)/lib $(NCCL_HOME)/lib64 $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/lib,$(d)/libnccl.so $(d)/libnccl.so.2))))
# pip's NCCL has libnccl.so.2 but no libnccl.so for -lnccl to find.
NCCL_LINK := $(if $(wildcard $(NCCL_LIB)libnccl.so),-lnccl,-l:libnccl.so.2)
CUBLAS_LIB := $(firstword $(dir $(wildcard $(CUDA_HOME)/lib64/libcublas.so $(CUDA_HOME)/lib/libcublas.so /usr/lib/x86_64-linux-gnu/libcublas.so)))
HAVE_CUBLAS_H := $(wildcard $(CUDA_HOME)/include/cublas_v2.h /usr/include/cublas_v2.h)
HAVE_OPENMP := $(shell printf 'int main(void){return 0;}' | $(or $(CC),cc) -fopenmp -x c - -o /dev/null 2>/dev/null && echo yes)
HAVE_GNUPLOT := $(shell command -v gnuplot 2>/dev/null)
HAVE_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes)
# MPI (the mpi backend): the compile and link flags its mpicc wraps (OpenMPI's
# --showme, else MPICH's pkg-config), kept only if a program with mpi.h links.
# MPI=0 leaves it out.
MPI_CFLAGS := $(if $(filter 0,$(MPI)),,$(shell mpicc --showme:compile 2>/dev/null || pkg-config --cflags mpich 2>/dev/null))
MPI_LIBS := $(if $(filter 0,$(MPI)),,$(shell mpicc --showme:link 2>/dev/null || pkg-config --libs mpich 2>/dev/null))
HAVE_MPI := $(if $(filter 0,$(MPI)),,$(shell printf '\043include <mpi.h>\nint main(void){return MPI_Init(0,0);}' | $(or $(CC),cc) $(MPI_CFLAGS) -x c - $(MPI_LIBS) -o /dev/null 2>/dev/null && echo yes))
CUDA_FOUND := $(if $(and $(NVCC_PATH),$(CUDA_LIBDIR),$(NCCL_INC),$(NCCL_LIB),$(CUBLAS_LIB),$(HAVE_CUBLAS_H)),yes)

# The build mode sticks: a make that names a mode (make CUDA=0) records it in
# build/mode at the top of the course, and a later make that names none (a
# chapter's `make`, or the `make -C tests` inside a test) builds in the
# recorded mode instead of detecting again, so it never rebuilds the tree
# in another mode halfway through a test run. `make clean` forgets it.
COURSE_MODE_FILE := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))../build/mode)
ifeq ($(origin CUDA),undefined)
COURSE_MODE_KEPT := $(strip $(shell cat $(COURSE_MODE_FILE) 2>/dev/null))
ifneq ($(COURSE_MODE_KEPT),)
CUDA := $(COURSE_MODE_KEPT)
endif
else ifneq ($(ASAN),1)
$(shell mkdir -p $(dir $(COURSE_MODE_FILE)) && echo '$(CUDA)' >$(COURSE_MODE_FILE))
endif

ifeq ($(CUDA),emu)
$(info [build] CUDA:    not needed: emu/ stands in for the CUDA runtime, cuBLAS and NCCL (CUDA=emu))
else
$(info [build] nvcc:    $(if $(NVCC_PATH),found at $(firstword $(NVCC_PATH)),not found: no GPU code is built))
$(info [build] NCCL:    $(if $(and $(NCCL_INC),$(NCCL_LIB)),found (header $(NCCL_INC)nccl.h, library $(NCCL_LIB)$(if $(NCCL_FROM_PYTHON), - the Python package nvidia-nccl)),not found (need nccl.h and libnccl.so; NCCL_HOME=folder sets where): the nccl backend is not built))
$(info [build] cuBLAS:  $(if $(and $(CUBLAS_LIB),$(HAVE_CUBLAS_H)),found in $(CUBLAS_LIB),not found: GPU matrix products are not built))
endif
$(info [build] OpenMP:  $(if $(HAVE_OPENMP),found: CPU kernels use all cores,not found: CPU kernels run on one thread))
$(info [build] MPI:     $(if $(HAVE_MPI),found: --backend mpi works under mpirun (MPI=0 leaves it out),$(if $(filter 0,$(MPI)),left out (MPI=0),not found: no --backend mpi (apt-get install libopenmpi-dev openmpi-bin))))
$(info [build] gnuplot: $(if $(HAVE_GNUPLOT),found: make plots draws PNG figures,not found: make plots writes CSV only (apt-get install gnuplot-nox)))

export COURSE_DETECTED := 1
export NVCC_PATH CUDA_HOME CUDA_LIBDIR NCCL_HOME NCCL_INC NCCL_LIB NCCL_LINK CUBLAS_LIB HAVE_CUBLAS_H HAVE_OPENMP HAVE_GNUPLOT HAVE_GPU CUDA_FOUND MPI_CFLAGS MPI_LIBS HAVE_MPI
endif

# The sanitizers cannot instrument nvcc's code, so ASAN=1 builds the CPU
# paths only - or the emulated GPU (CUDA=emu), whose kernels are ordinary
# host code that ASan checks like any other.
ifeq ($(ASAN),1)
ifneq ($(CUDA),emu)
CUDA := 0
endif
endif
ifeq ($(CUDA),emu)
HAVE_CXX := $(shell printf 'int main(){return 0;}' | $(or $(CXX),g++) -x c++ - -o /dev/null 2>/dev/null && echo yes)
ifneq ($(HAVE_CXX),yes)
$(error CUDA=emu compiles the .cu files as C++, as nvcc does, and needs a C++ compiler: apt-get install g++ (or set CXX))
endif
endif
ifeq ($(CUDA),1)
ifneq ($(CUDA_FOUND),yes)
$(error CUDA=1 was asked for, but nvcc, NCCL and cuBLAS were not all found (see the lines above); set CUDA_HOME/NCCL_HOME or use CUDA=0)
endif
endif
CUDA ?= $(if $(CUDA_FOUND),1,0)
ifndef COURSE_MODE_SHOWN
$(info [build] mode:    $(if $(filter 1,$(CUDA)),CUDA build (GPU paths + CPU fallback),$(if $(filter emu,$(CUDA)),emulated GPU (the CUDA code on the CPU; see emu/README.md),CPU-only build))$(if $(filter 1,$(ASAN)), with AddressSanitizer + UBSan)$(if $(COURSE_MODE_KEPT), (CUDA=$(CUDA) kept from an earlier make; make CUDA=... or make clean to change)))
export COURSE_MODE_SHOWN := 1
endif
export CUDA

