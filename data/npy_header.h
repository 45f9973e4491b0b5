// NumPy's .npy header, the Python dict literal after the magic, version and length: read by its
// grammar, as numpy.lib.format reads it (ast.literal_eval), not by patterns over its text.
//
// numpy.save writes `{'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }` padded with
// spaces to a multiple of 64 bytes and ended by a newline, in format 1.0, 2.0 (a longer header) or
// 3.0 (a UTF-8 header); other writers quote with " and leave out the trailing commas. So the keys
// come in any order, quoted either way, each exactly once, with no other key; 'shape' is a tuple of
// integers ((N,), (N, M), (), and (N) taken as (N,)) or a list ([N]); Python 2's long suffix (10L)
// is read. Anything else is a UserError naming the file and what is wrong, at which character.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llm {

struct NpyHeader {
  std::string descr;            // the dtype, e.g. "<u2"
  bool fortran_order = false;
  std::vector<uint64_t> shape;  // () for a scalar
};

// `text`: the header's bytes after the length field; `path` for the messages.
NpyHeader parse_npy_header(const std::string& text, const std::string& path);

// The shape as Python writes it: "(1000,)", "(2, 500)", "()".
std::string shape_text(const std::vector<uint64_t>& shape);

}  // namespace llm
