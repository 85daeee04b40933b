// libFuzzer entry point for the GGUF header reader (src/model/gguf.cpp). Every
// input must give a value or an Error, never a crash, a sanitizer report, a
// leak, a hang or an allocation beyond what the input's bytes can hold.
// Built by -DGPUMEM_FUZZ=ON (fuzz/CMakeLists.txt); run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpumem/model/gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    const auto n = static_cast<std::int64_t>(size);

    // The input is the whole file: the data section must fit in it.
    auto whole = gpumem::parse_gguf(bytes, n);
    if (whole.ok()) {
        const gpumem::GgufFile& g = whole.value();
        // Values the reader promises for a file it accepts.
        if (g.alignment == 0 || (g.alignment & (g.alignment - 1)) != 0 || g.data_offset % g.alignment != 0 ||
            g.data_size < 0 || g.tensors.size() > size)
            __builtin_trap();
        for (const auto& t : g.tensors) {
            const gpumem::GgmlType* type = gpumem::ggml_type_by_id(t.type);
            if (!type || t.ne.empty() || t.ne.size() > 4 || t.bytes < 0) __builtin_trap();
            (void)g.tensor(t.name);
        }
        (void)g.arch_int("block_count");
    }
    // The input is only the first bytes of a larger file (header-only read).
    (void)gpumem::parse_gguf(bytes, n + (std::int64_t{1} << 40));
    return 0;
}
