# common/chapter.mk - included by every chapter's Makefile after course.mk,
# so that the course's commands work from inside a chapter's folder too:
#   make test                            this chapter's tests
#   make check-exercise EX=name          one of this chapter's exercises
#                                        (EX=NN/name and SOLUTION=1 work too)
#   make plots                           every figure, as from the top folder
# Each one runs the top-level Makefile, which builds what it needs first.
# A chapter may set CHAPTER_TESTS (names for tests/run.sh) before including.
CHAPTER := $(notdir $(CURDIR))
CHAPTER_TESTS ?= $(CHAPTER)

.PHONY: test check-exercise plots
test:
	@$(MAKE) --no-print-directory -C $(COURSE_ROOT) test TESTS="$(CHAPTER_TESTS)"

check-exercise:
	@$(MAKE) --no-print-directory -C $(COURSE_ROOT) check-exercise \
	    EX=$(if $(findstring /,$(EX)),$(EX),$(if $(EX),$(firstword $(subst _, ,$(CHAPTER)))/$(EX))) \
	    $(if $(SOLUTION),SOLUTION=$(SOLUTION))

plots:
	@$(MAKE) --no-print-directory -C $(COURSE_ROOT) plots
