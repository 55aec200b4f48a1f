# common/exercise.mk - the build fragment of every NN_chapter/exercises/Makefile.
#
# tools/check_exercise.sh runs an exercises/Makefile inside build/<variant>/,
# so that builds of your file and of the solution never overwrite each other,
# with
#   EXERCISE      the exercise's name, e.g. pingpong
#   EXERCISE_SRC  the file to check (yours, the solution's, or --file's)
# The Makefile sets EXERCISES_DIR (its own folder) and, when the check needs
# them, CU_SRCS, then includes this file. check_<name>.c is built with
# common/course.mk's flags (and common/exercise_check.h, the checks' shared
# harness) and linked with the exercise file, which is compiled on its own.
ifndef EXERCISE
$(error run this through tools/check_exercise.sh: make check-exercise EX=NN/name)
endif
PROGRAMS := check_$(EXERCISE)
include $(EXERCISES_DIR)/../../common/course.mk
CFLAGS += -I$(EXERCISES_DIR)
vpath check_%.c $(EXERCISES_DIR)

# A CUDA exercise is compiled by nvcc in a CUDA build, or for the emulated
# GPU (CUDA=emu, see emu/README.md); in a CPU-only build its check program
# says that it cannot run here.
ifeq ($(suffix $(EXERCISE_SRC)),.cu)
ifeq ($(CUDA),1)
check_$(EXERCISE): build/$(EXERCISE).o
build/$(EXERCISE).o: $(EXERCISE_SRC)
	@mkdir -p build
	$(NVCC_PATH) $(NVCCFLAGS) -I$(EXERCISES_DIR) -MMD -MP -c $< -o $@
else ifeq ($(CUDA),emu)
check_$(EXERCISE): build/$(EXERCISE).o
build/$(EXERCISE).o: $(EXERCISE_SRC) $(CU2EMU) $(EMU_LIB)
	@mkdir -p build
	$(CU2EMU) $< build/$(EXERCISE).emu.cpp
	$(CXX) $(CXXFLAGS) -I$(EXERCISES_DIR) -I$(dir $<) -MMD -MP -c build/$(EXERCISE).emu.cpp -o $@
endif
else
check_$(EXERCISE): build/$(EXERCISE).o
build/$(EXERCISE).o: $(EXERCISE_SRC)
	@mkdir -p build
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@
endif
