// libFuzzer target: a model file as `gpumem estimate FILE.json` reads it
// (load_model: a gpumem model graph, a layer list or an HF config, chosen by
// content), then an estimate. Corpus: fuzz/corpus/graph_json/ (traced model
// graphs from tests/fixtures, fuzz/make_corpus.py).
#include "fuzz_graph.hpp"
#include "gpumem/model/load.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string& path = gpumem_fuzz::write_scratch("model.json", gpumem_fuzz::as_text(data, size));
    gpumem_fuzz::answer_or_error([&] {
        auto g = gpumem::load_model(path);
        gpumem_fuzz::check_error_message(g);
        if (g.ok()) gpumem_fuzz::exercise_graph(g.value());
    });
    return 0;
}
