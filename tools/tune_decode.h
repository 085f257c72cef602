/* flashcl-tune --decode (tools/tune_decode.c): the split-count sweep of
 * flashcl_attention_decode. Returns the process exit status. */
#ifndef FLASHCL_TOOLS_TUNE_DECODE_H
#define FLASHCL_TOOLS_TUNE_DECODE_H

int tune_decode_main(int argc, char **argv);

#endif
