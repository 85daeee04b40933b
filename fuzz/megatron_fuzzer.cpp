// libFuzzer target: a Megatron-LM arguments file (`gpumem compat megatron
// ARGS.json`) through megatron_report_from_file: reading, Megatron's argument
// defaults and derivations, and the theoretical-memory report in doubles.
// Corpus: fuzz/corpus/megatron/ (fuzz/make_corpus.py).
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "fuzz_common.hpp"
#include "gpumem/plan/compat_megatron.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string& path = gpumem_fuzz::write_scratch("args.json", gpumem_fuzz::as_text(data, size));
    gpumem_fuzz::answer_or_error([&] {
        auto r = gpumem::megatron_report_from_file(path);
        gpumem_fuzz::check_error_message(r);
        if (r.ok() && !(r.value().total_bytes >= 0)) {
            std::fprintf(stderr, "finding: Megatron report total %g bytes\n", r.value().total_bytes);
            std::abort();
        }
    });
    return 0;
}
