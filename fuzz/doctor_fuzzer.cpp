// libFuzzer target: the OOM doctor's text input (a pasted "CUDA out of
// memory" message) through parse_oom_message and diagnose (verdict and
// remedies without a run). Accepted messages are checked: no negative byte
// count. Corpus: fuzz/corpus/doctor/ (the doctor tests' messages,
// fuzz/make_corpus.py).
#include <cstdio>
#include <cstdlib>

#include "fuzz_common.hpp"
#include "gpumem/plan/doctor.hpp"

namespace {
void non_negative(gpumem::Bytes b, const char* what) {
    if (b.count() < 0) {
        std::fprintf(stderr, "finding: OOM report %s is %lld bytes\n", what, static_cast<long long>(b.count()));
        std::abort();
    }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto text = gpumem_fuzz::as_text(data, size);
    gpumem_fuzz::answer_or_error([&] {
        auto r = gpumem::parse_oom_message(text);
        gpumem_fuzz::check_error_message(r);
        if (!r.ok()) return;
        const auto& o = r.value();
        non_negative(o.requested, "requested");
        non_negative(o.total_capacity, "total capacity");
        non_negative(o.free, "free");
        non_negative(o.allocated, "allocated");
        non_negative(o.reserved, "reserved");
        non_negative(o.reserved_unallocated, "reserved but unallocated");
        non_negative(o.outside_pytorch(), "outside PyTorch");
        non_negative(o.other_processes_total(), "other processes");
    });
    gpumem_fuzz::answer_or_error([&] {
        auto d = gpumem::diagnose(text, std::nullopt);
        gpumem_fuzz::check_error_message(d);
    });
    return 0;
}
