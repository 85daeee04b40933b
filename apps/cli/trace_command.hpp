// `gpumem trace SCRIPT.py:FUNCTION ...`: runs gpumem's PyTorch tracer
// (bindings/python/gpumem/tracer.py, embedded in the binary) with the user's
// Python, which must have torch >= 1.13. The tracer builds the model on the
// meta device and writes a model graph file (docs/model-graph.md) that every
// gpumem command takes as MODEL. Tracing needs the user's model code and
// PyTorch, so it runs in their Python rather than in this process.
#pragma once

#include <string>
#include <vector>

namespace gpumem::cli {

// Runs the tracer with `args` (everything after `gpumem trace`); returns the
// exit status (2 for a usage or tracing error, with one line on stderr).
int run_trace_command(const std::vector<std::string>& args);

}  // namespace gpumem::cli
