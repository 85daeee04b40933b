// libFuzzer target: a Hugging Face config.json, through load_hf_config_file
// (bounded reading, JSON parsing, parse_hf_config, build_transformer), then an
// estimate of the graph it gives. Corpus: fuzz/corpus/hf_config/ (presets and
// test configs, fuzz/make_corpus.py).
#include "fuzz_graph.hpp"
#include "gpumem/model/load.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string& path = gpumem_fuzz::write_scratch("config.json", gpumem_fuzz::as_text(data, size));
    gpumem_fuzz::answer_or_error([&] {
        auto g = gpumem::load_hf_config_file(path);
        gpumem_fuzz::check_error_message(g);
        if (g.ok()) gpumem_fuzz::exercise_graph(g.value());
    });
    return 0;
}
