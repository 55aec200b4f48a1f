# common/chapter.mk - included by every chapter's Makefile after course.mk,
# so that the course's commands work from inside a chapter's folder too:
#   make test                            this chapter's tests
#   make check-exercise EX=name          one of this chapter's exercises
#                                        (EX=NN/name and SOLUTION=1 work too)
#   make plots, make speedup, make data  as from the top folder
# Each one runs the top-level Makefile, which builds what it needs first.
# A chapter may set, before including this file, CHAPTER_TESTS (names for
# tests/run.sh) and CHAPTER_USES_DDPRUN=1 (its program is started with
# tools/ddprun, so `make NN_name` builds the launcher too).
CHAPTER := $(notdir $(CURDIR))
CHAPTER_TESTS ?= $(CHAPTER)

.PHONY: test check-exercise plots speedup data
test:
	@$(MAKE) --no-print-directory -C $(COURSE_ROOT) test TESTS="$(CHAPTER_TESTS)"

check-exercise:
	@$(MAKE) --no-print-directory -C $(COURSE_ROOT) check-exercise \
	    EX=$(if $(findstring /,$(EX)),$(EX),$(if $(EX),$(firstword $(subst _, ,$(CHAPTER)))/$(EX))) \
	    $(if $(SOLUTION),SOLUTION=$(SOLUTION))

plots speedup data:
	@$(MAKE) --no-print-directory -C $(COURSE_ROOT) $@

ifeq ($(CHAPTER_USES_DDPRUN),1)
# Order-only: the launcher is built (or found up to date) before the
# program, without making the program look out of date.
$(PROGRAMS): | launcher
.PHONY: launcher
launcher:
	@$(MAKE) -s --no-print-directory -C $(COURSE_ROOT)/tools ddprun
endif
