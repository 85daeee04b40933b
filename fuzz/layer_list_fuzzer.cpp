// libFuzzer target: a layer-list JSON ({"layers": [...]}) through
// load_layer_list_file, then an estimate of the graph it gives.
// Corpus: fuzz/corpus/layer_list/ (tests/fixtures/models, fuzz/make_corpus.py).
#include "fuzz_graph.hpp"
#include "gpumem/model/load.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string& path = gpumem_fuzz::write_scratch("layers.json", gpumem_fuzz::as_text(data, size));
    gpumem_fuzz::answer_or_error([&] {
        auto g = gpumem::load_layer_list_file(path);
        gpumem_fuzz::check_error_message(g);
        if (g.ok()) gpumem_fuzz::exercise_graph(g.value());
    });
    return 0;
}
