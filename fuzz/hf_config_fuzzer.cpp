// libFuzzer target: a Hugging Face config.json, through load_hf_config_file
// (bounded reading, JSON parsing, parse_hf_config, build_transformer), then an
// estimate of the graph it gives. Corpus: fuzz/corpus/hf_config/ (presets and
// test configs, fuzz/make_corpus.py).
#include "fuzz_graph.hpp"
#include "gpumem/model/load.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return gpumem_fuzz::fuzz_model_file("config.json", data, size, [](const std::string& path) { return gpumem::load_hf_config_file(path); });
}
