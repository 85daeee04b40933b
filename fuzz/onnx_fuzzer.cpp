// libFuzzer target: serialized ONNX ModelProto bytes through load_onnx_bytes
// (protobuf parsing with libonnx's generated classes, gpumem's shape rules
// and probes), then an estimate of the graph. Corpus: fuzz/corpus/onnx/ (the
// smallest ONNX fixtures, fuzz/make_corpus.py).
#include "fuzz_graph.hpp"
#include "gpumem/model/onnx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    gpumem_fuzz::answer_or_error([&] {
        auto g = gpumem::load_onnx_bytes(gpumem_fuzz::as_text(data, size), "fuzz.onnx");
        gpumem_fuzz::check_error_message(g);
        if (g.ok()) gpumem_fuzz::exercise_graph(g.value());
    });
    return 0;
}
