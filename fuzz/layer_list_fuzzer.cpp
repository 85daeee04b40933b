// libFuzzer target: a layer-list JSON ({"layers": [...]}) through
// load_layer_list_file, then an estimate of the graph it gives.
// Corpus: fuzz/corpus/layer_list/ (tests/fixtures/models, fuzz/make_corpus.py).
#include "fuzz_graph.hpp"
#include "gpumem/model/load.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return gpumem_fuzz::fuzz_model_file("layers.json", data, size, [](const std::string& path) { return gpumem::load_layer_list_file(path); });
}
