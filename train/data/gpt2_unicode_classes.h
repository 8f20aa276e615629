// The character classes of GPT-2's pre-tokenization pattern (\p{L}, \p{N}, \s) as sorted
// code-point ranges, generated from Node.js's regular expressions by
// gpt2_unicode_classes_gen.js (the version is in the generated file). Internal to
// gpt2_tokenizer.
#ifndef RINGMASTER_TRAIN_DATA_GPT2_UNICODE_CLASSES_H_
#define RINGMASTER_TRAIN_DATA_GPT2_UNICODE_CLASSES_H_

#include <cstdint>

namespace ringmaster::train::data::internal {

enum class CodePointClass : uint8_t {
  kOther,   // none of the below (also every code point no range covers)
  kLetter,  // \p{L}
  kNumber,  // \p{N}
  kSpace,   // JavaScript's \s: white space and line terminators
};

struct CodePointRange {
  uint32_t first;  // inclusive
  uint32_t last;   // inclusive
  CodePointClass code_point_class;
};

// Sorted by `first`, not overlapping; adjacent ranges of one class are merged.
extern const CodePointRange kGpt2CodePointRanges[];
extern const int kGpt2CodePointRangeCount;
extern const char kGpt2UnicodeVersion[];

}  // namespace ringmaster::train::data::internal

#endif  // RINGMASTER_TRAIN_DATA_GPT2_UNICODE_CLASSES_H_
