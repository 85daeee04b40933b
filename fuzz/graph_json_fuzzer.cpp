// libFuzzer target: a model file as `gpumem estimate FILE.json` reads it
// (load_model: a gpumem model graph, a layer list or an HF config, chosen by
// content), then an estimate. Corpus: fuzz/corpus/graph_json/ (traced model
// graphs from tests/fixtures, fuzz/make_corpus.py).
#include "fuzz_graph.hpp"
#include "gpumem/model/load.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return gpumem_fuzz::fuzz_model_file("model.json", data, size, [](const std::string& path) { return gpumem::load_model(path); });
}
