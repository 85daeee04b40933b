// The JSON snapshot reader's read-ahead, as a setting tests can change.
//
// A large JSON snapshot is read by two threads: the reader from the start,
// and a read-ahead that lexes the trace entries from a point near the middle
// of the text into compact records, which the reader hands to the Reader in
// order once it reaches that point (src/sim/snapshot_read.cpp, FastJson::
// Ahead). The answer is the reader's alone: the read-ahead's records are
// used only when the reader arrives exactly where the read-ahead began, as
// an element of a trace list it reads, and only up to the first entry the
// read-ahead could not read alone. Files under `min_bytes` are read by one
// thread; tests lower it to run small files through the same path.
#pragma once

#include <cstddef>

namespace gpumem::sim::detail {

struct JsonReadAhead {
    std::size_t min_bytes = std::size_t(64) << 20;  // smaller texts: no read-ahead
    double at = 0.42;                                // where it begins, as a fraction of the text
};
JsonReadAhead json_read_ahead();
void set_json_read_ahead(const JsonReadAhead& r);
// Entries the reader took from read-aheads so far in this process (tests:
// that the path ran).
std::size_t json_read_ahead_entries();

}  // namespace gpumem::sim::detail
