# gpt/gpt_cuda.mk - links the GPU model into a folder's programs in a CUDA
# or emulated-GPU build (included after common/course.mk by gpt.mk and by
# tests/Makefile). The object is compiled once, in gpt/build/, by
# gpt/Makefile; each folder asks that make for it, and it recompiles only
# when gpt_cuda.cu or a header it includes changed (its .d file).
ifneq ($(filter 1 emu,$(CUDA)),)
GPT_CUDA_OBJ := $(COURSE_ROOT)/gpt/build/gpt_cuda.o
$(PROGRAMS): $(GPT_CUDA_OBJ)
# FORCE: a target that is never a file, so that gpt/'s make is asked every
# time; the programs relink only when the object is newer than they are.
$(GPT_CUDA_OBJ): FORCE
	@$(MAKE) --no-print-directory -C $(COURSE_ROOT)/gpt object
FORCE:
endif
