// fuzz_wikitext.h - what fuzz_wikitext.c and seed_gen.c must agree on: the
// tokenizer (trained on a made-up article) and the text a token cache is for.
#ifndef COURSE_FUZZ_WIKITEXT_H
#define COURSE_FUZZ_WIKITEXT_H
#include "wikitext.h"

#define FUZZ_WIKITEXT_CORPUS                                                                              \
    "\n = Fuzzing = \n\n Fuzzing feeds a program with inputs nobody meant to write . The program must " \
    "refuse them , never crash . \n\n = = Uses = = \n\n It finds bugs in parsers , decoders and network " \
    "servers . \n"
#define FUZZ_WIKITEXT_CACHE_TEXT FUZZ_WIKITEXT_CORPUS // the cache seed holds this text's tokens

static inline bpe_t *fuzz_wikitext_tokenizer(void) {
    return bpe_train(FUZZ_WIKITEXT_CORPUS, strlen(FUZZ_WIKITEXT_CORPUS), 320);
}
#endif
