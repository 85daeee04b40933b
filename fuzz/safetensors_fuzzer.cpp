// libFuzzer target: a .safetensors file as read_safetensors_header reads it
// (8-byte little-endian header length, JSON header, data section never read),
// and the in-memory parse_safetensors_header on the same bytes as a header.
// Accepted headers are checked: every tensor lies inside the file's data and
// its byte size matches its shape. Corpus: fuzz/corpus/safetensors/
// (fuzz/make_corpus.py).
#include <cstdio>
#include <cstdlib>

#include "fuzz_common.hpp"
#include "gpumem/model/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto bytes = gpumem_fuzz::as_text(data, size);
    const std::string& path = gpumem_fuzz::write_scratch("model.safetensors", bytes);
    gpumem_fuzz::answer_or_error([&] {
        auto h = gpumem::read_safetensors_header(path);
        gpumem_fuzz::check_error_message(h);
        if (!h.ok()) return;
        for (const auto& t : h.value().tensors) {
            if (t.begin < 0 || t.end < t.begin || t.numel < 0 || t.end > h.value().file_size) {
                std::fprintf(stderr, "finding: accepted tensor %s with offsets [%lld, %lld) numel %lld in a %lld-byte file\n",
                             t.name.c_str(), static_cast<long long>(t.begin), static_cast<long long>(t.end),
                             static_cast<long long>(t.numel), static_cast<long long>(h.value().file_size));
                std::abort();
            }
        }
    });
    gpumem_fuzz::answer_or_error([&] {
        auto h = gpumem::parse_safetensors_header(std::string(bytes), 1 << 20, "header.json");
        gpumem_fuzz::check_error_message(h);
    });
    return 0;
}
