// The OOM doctor: message parsing (both PyTorch wordings), verdicts, ranked
// remedies, and remedy predictions checked against independent simulate_estimate() calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/plan/doctor.hpp"
#include "gpumem/sim/simulate.hpp"
#include "gpumem/report/doctor_render.hpp"

using namespace gpumem;

namespace {

// Seed 001 (shared/seeds/001_*.txt), PyTorch <= 2.0 wording.
const char* kSeed001 =
    "CUDA out of memory. Tried to allocate 1.24 GiB (GPU 0; 15.78 GiB total capacity; 10.34 GiB already allocated; "
    "435.50 MiB free; 14.21 GiB reserved in total by PyTorch)";

// PyTorch >= 2.2 wording (expandable_segments hint), an 80 GB card nearly full.
const char* kV2Full =
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
    "1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use. Of the allocated memory 76.50 GiB "
    "is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

// Shape of a real report: other jobs hold most of a 48 GB card.
const char* kV2Others =
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 42.00 MiB. GPU 0 has a total capacity of 47.27 GiB of which "
    "9.38 MiB is free. Process 644963 has 5.59 MiB memory in use. Process 644977 has 5.59 MiB memory in use. Process 2925282 "
    "has 312.00 MiB memory in use. Process 3053273 has 29.04 GiB memory in use. Process 3120922 has 14.74 GiB memory in use. "
    "Including non-PyTorch memory, this process has 3.14 GiB memory in use. Of the allocated memory 2.92 GiB is allocated by "
    "PyTorch, and 34.62 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.";

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

std::int64_t gib(double x) { return static_cast<std::int64_t>(std::llround(x * kGiB)); }
std::int64_t mib(double x) { return static_cast<std::int64_t>(std::llround(x * kMiB)); }

const Remedy* find(const DoctorResult& d, const std::string& key) {
    for (const auto& r : d.remedies)
        if (r.key == key) return &r;
    return nullptr;
}

EstimateRequest llama_run() {
    EstimateRequest req;
    req.model = "llama-3-8b";
    req.mode = Mode::Train;
    req.batch = 4;
    req.seq = 4096;
    req.gpu = "A100-80GB";
    return req;
}

}  // namespace

TEST(DoctorParse, Seed001OldWording) {
    auto r = parse_oom_message(kSeed001);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const OomReport& o = r.value();
    EXPECT_EQ(o.wording, "1.x");
    EXPECT_EQ(o.device_kind, "CUDA");
    ASSERT_TRUE(o.gpu_index.has_value());
    EXPECT_EQ(*o.gpu_index, 0);
    EXPECT_EQ(o.requested.count(), gib(1.24));
    EXPECT_EQ(o.total_capacity.count(), gib(15.78));
    EXPECT_EQ(o.allocated.count(), gib(10.34));
    EXPECT_EQ(o.free.count(), mib(435.50));
    EXPECT_EQ(o.reserved.count(), gib(14.21));
    EXPECT_EQ(o.reserved_unallocated.count(), gib(14.21) - gib(10.34));
    EXPECT_NEAR(o.reserved_unallocated.gib(), 3.87, 1e-9);
    EXPECT_FALSE(o.this_process.has_value());
    EXPECT_TRUE(o.other_processes.empty());
}

TEST(DoctorParse, NewWordingWithProcesses) {
    auto r = parse_oom_message(kV2Others);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const OomReport& o = r.value();
    EXPECT_EQ(o.wording, "2.x");
    EXPECT_EQ(o.requested.count(), mib(42.0));
    EXPECT_EQ(o.total_capacity.count(), gib(47.27));
    EXPECT_EQ(o.free.count(), mib(9.38));
    EXPECT_EQ(o.allocated.count(), gib(2.92));
    EXPECT_EQ(o.reserved_unallocated.count(), mib(34.62));
    EXPECT_EQ(o.reserved.count(), gib(2.92) + mib(34.62));
    ASSERT_TRUE(o.this_process.has_value());
    EXPECT_EQ(o.this_process->count(), gib(3.14));
    EXPECT_FALSE(o.this_process_inferred);
    ASSERT_EQ(o.other_processes.size(), 5u);
    EXPECT_EQ(o.other_processes[3].pid, 3053273);
    EXPECT_EQ(o.other_processes[3].in_use.count(), gib(29.04));
    EXPECT_EQ(o.other_processes_total().count(), mib(5.59) * 2 + mib(312.0) + gib(29.04) + gib(14.74));
}

// Line breaks, torchrun rank prefixes, the 2.1 "capacty" typo, "bytes" and
// KiB units, an empty GPU index and the prefix-less "Out of memory." of
// recent main all parse.
TEST(DoctorParse, SpellingVariants) {
    {
        auto r = parse_oom_message(
            "[rank1]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB.\n"
            "[rank1]: GPU 0 has a total capacty of 14.75 GiB of which 11.06 MiB is free.\n"
            "[rank1]: Process 3258 has 14.73 GiB memory in use. Of the allocated memory 14.04 GiB is allocated by PyTorch,\n"
            "[rank1]: and 509.85 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "max_split_size_mb to avoid fragmentation.");
        ASSERT_TRUE(r.ok()) << r.error().message;
        EXPECT_EQ(r->wording, "2.x");
        EXPECT_EQ(r->total_capacity.count(), gib(14.75));
        // PID namespace: the only process holding PyTorch's reserved memory is this one.
        ASSERT_TRUE(r->this_process.has_value());
        EXPECT_TRUE(r->this_process_inferred);
        EXPECT_EQ(r->this_process_pid.value_or(0), 3258);
        EXPECT_TRUE(r->other_processes.empty());
    }
    {
        auto r = parse_oom_message(
            "RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 8.00 GiB total capacity; 203.44 MiB already "
            "allocated; 0 bytes free; 6.44 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
            "max_split_size_mb to avoid fragmentation.");
        ASSERT_TRUE(r.ok()) << r.error().message;
        EXPECT_EQ(r->free.count(), 0);
        EXPECT_EQ(r->allocated.count(), mib(203.44));
    }
    {
        auto r = parse_oom_message(
            "Out of memory. Tried to allocate 512 bytes. GPU  has a total capacity of 23.69 GiB of which 982.50 KiB is free. "
            "Of the allocated memory 23.00 GiB is allocated by PyTorch, with 1.50 GiB allocated in private pools (e.g., CUDA Graphs), "
            "and 100 B is reserved by PyTorch but unallocated.");
        ASSERT_TRUE(r.ok()) << r.error().message;
        EXPECT_EQ(r->requested.count(), 512);
        EXPECT_FALSE(r->gpu_index.has_value());
        EXPECT_EQ(r->free.count(), static_cast<std::int64_t>(std::llround(982.50 * 1024)));
        EXPECT_EQ(r->reserved_unallocated.count(), 100);
        ASSERT_TRUE(r->private_pools.has_value());
        EXPECT_EQ(r->private_pools->count(), gib(1.5));
    }
    {
        // 1.x with a memory fraction: "X allowed; " sits between free and reserved.
        auto r = parse_oom_message(
            "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 39.59 GiB total capacity; 19.50 GiB already allocated; "
            "19.00 GiB free; 19.80 GiB allowed; 19.60 GiB reserved in total by PyTorch)");
        ASSERT_TRUE(r.ok()) << r.error().message;
        EXPECT_EQ(r->gpu_index.value_or(-1), 1);
        ASSERT_TRUE(r->allowed.has_value());
        EXPECT_EQ(r->allowed->count(), gib(19.80));
        EXPECT_EQ(r->reserved.count(), gib(19.60));
    }
}

// NVML's "no value" (ULLONG_MAX, printed as 17179869184.00 GiB on Windows/WSL)
// is dropped, not parsed as an overflowing size.
TEST(DoctorParse, NvmlNoValueIgnored) {
    auto r = parse_oom_message(
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacty of 23.99 GiB of which 7.20 GiB is free. "
        "Including non-PyTorch memory, this process has 17179869184.00 GiB memory in use. Of the allocated memory 14.51 GiB is "
        "allocated by PyTorch, and 685.18 MiB is reserved by PyTorch but unallocated.");
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_FALSE(r->this_process.has_value());
    EXPECT_FALSE(r->notes.empty());
}

TEST(DoctorParse, GarbageAndTruncatedAreErrors) {
    auto g = parse_oom_message("Segmentation fault (core dumped)");
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.error().code, ErrorCode::ParseError);
    EXPECT_NE(g.error().message.find("Tried to allocate"), std::string::npos);  // says what was expected

    // pytorch/pytorch#126766: the message cut after "GPU".
    auto t = parse_oom_message("OutOfMemoryError: CUDA out of memory. Tried to allocate 3725.29 GiB. GPU");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("total capacity"), std::string::npos);

    auto partial = parse_oom_message(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free.");
    ASSERT_FALSE(partial.ok());
    EXPECT_NE(partial.error().message.find("reserved by PyTorch but unallocated"), std::string::npos);

    auto d = diagnose("hello world", std::nullopt);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.error().field, "message");
}

TEST(Doctor, Seed001IsFragmentation) {
    auto r = diagnose(kSeed001, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const DoctorResult& d = r.value();
    EXPECT_EQ(d.verdict, OomVerdict::Fragmented);
    EXPECT_STREQ(to_string(d.verdict), "fragmented");
    EXPECT_EQ(d.numbers.cached.count(), gib(14.21) - gib(10.34));
    EXPECT_GE(d.numbers.cached, d.numbers.requested);
    EXPECT_NE(d.headline.find("3.87 GiB"), std::string::npos) << d.headline;
    ASSERT_FALSE(d.remedies.empty());
    EXPECT_EQ(d.remedies[0].key, "expandable_segments");
    EXPECT_EQ(d.remedies[0].rank, 1);
    EXPECT_TRUE(d.remedies[0].addresses_verdict);
    EXPECT_EQ(d.remedies[0].saving.value_or(Bytes(0)), d.numbers.cached);
    EXPECT_NE(d.remedies[0].action.find("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), std::string::npos);

    const Remedy* ms = find(d, "max_split_size");
    ASSERT_NE(ms, nullptr);
    EXPECT_EQ(ms->rank, 2);
    EXPECT_NE(ms->action.find("max_split_size_mb:1024"), std::string::npos) << ms->action;  // 1.24 GiB request -> 1024 MiB

    // empty_cache() is listed as not a fix, last.
    const Remedy& last = d.remedies.back();
    EXPECT_EQ(last.key, "empty_cache");
    EXPECT_FALSE(last.is_fix);
    EXPECT_EQ(last.saving.value_or(Bytes(1)).count(), 0);

    // Without a model the model-side savings are not quantified, and say so.
    const Remedy* mb = find(d, "micro_batch");
    ASSERT_NE(mb, nullptr);
    EXPECT_FALSE(mb->saving.has_value());
    EXPECT_NE(mb->basis.find("--model"), std::string::npos);
    EXPECT_FALSE(mb->prediction.has_value());
    EXPECT_FALSE(d.baseline.has_value());
    // 1.x wording: expandable segments needs a newer PyTorch; said in a finding.
    EXPECT_TRUE(std::any_of(d.findings.begin(), d.findings.end(), [](const std::string& s) { return s.find("2.1") != std::string::npos; }));
}

TEST(Doctor, NewWordingFullCard) {
    auto r = diagnose(kV2Full, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const DoctorResult& d = r.value();
    EXPECT_EQ(d.oom.wording, "2.x");
    EXPECT_EQ(d.verdict, OomVerdict::Full);
    EXPECT_EQ(d.numbers.reserved.count(), gib(76.50) + gib(1.02));
    // The allocator remedies do not address a full card; the model-side ones do.
    const Remedy* es = find(d, "expandable_segments");
    ASSERT_NE(es, nullptr);
    EXPECT_FALSE(es->addresses_verdict);
    EXPECT_TRUE(d.remedies[0].addresses_verdict);
    EXPECT_EQ(d.remedies[0].key, "micro_batch");
}

TEST(Doctor, OtherProcessesAreTheCause) {
    auto r = diagnose(kV2Others, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const DoctorResult& d = r.value();
    EXPECT_EQ(d.verdict, OomVerdict::OutsidePytorch);
    EXPECT_EQ(d.remedies[0].key, "free_outside_memory");
    EXPECT_TRUE(d.remedies[0].addresses_verdict);
    EXPECT_GE(d.remedies[0].saving.value_or(Bytes(0)).count(), gib(29.04) + gib(14.74));
}

TEST(Doctor, DeterministicAndSuggestedSplitSize) {
    auto a = diagnose(kSeed001, std::nullopt);
    auto b = diagnose(kSeed001, std::nullopt);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(doctor_to_json(a.value()).dump(), doctor_to_json(b.value()).dump());
    EXPECT_EQ(suggested_max_split_size_mb(MiB(42)), 32);
    EXPECT_EQ(suggested_max_split_size_mb(MiB(20)), 32);  // PyTorch requires > 20
    EXPECT_EQ(suggested_max_split_size_mb(MiB(300)), 256);
    EXPECT_EQ(suggested_max_split_size_mb(GiB(2)), 2048);
}

// With the run's settings every model-side remedy is priced by simulate_estimate():
// the numbers must equal independent simulate_estimate() calls made here.
TEST(Doctor, WithRunPricesRemediesWithEstimate) {
    const EstimateRequest run = llama_run();
    auto r = diagnose(kV2Full, run);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const DoctorResult& d = r.value();
    ASSERT_TRUE(d.baseline.has_value());

    auto base = simulate_estimate(run);
    ASSERT_TRUE(base.ok()) << base.error().message;
    EXPECT_EQ(d.baseline->peak_reserved, base->per_gpu.peak_reserved);
    EXPECT_EQ(d.baseline->total_device, base->per_gpu.total_device);

    auto check = [&](const std::string& key, EstimateRequest variant) {
        const Remedy* rem = find(d, key);
        ASSERT_NE(rem, nullptr) << key;
        ASSERT_TRUE(rem->prediction.has_value()) << key << ": " << rem->basis;
        auto e = simulate_estimate(variant);
        ASSERT_TRUE(e.ok()) << key << ": " << e.error().message;
        EXPECT_EQ(rem->prediction->peak_reserved, e->per_gpu.peak_reserved) << key;
        EXPECT_EQ(rem->prediction->peak_allocated, e->per_gpu.peak_allocated) << key;
        EXPECT_EQ(rem->prediction->total_device, e->per_gpu.total_device) << key;
        EXPECT_EQ(rem->saving.value_or(Bytes(-1)), base->per_gpu.peak_reserved - e->per_gpu.peak_reserved) << key;
        EXPECT_EQ(rem->prediction->fits_message_gpu, e->per_gpu.total_device <= d.numbers.total_capacity) << key;
    };
    {
        EstimateRequest v = run;
        v.batch = 2;
        v.grad_accum = 2;
        check("micro_batch", v);
    }
    {
        EstimateRequest v = run;
        v.recompute = Recompute::Full;
        check("recompute_full", v);
    }
    {
        EstimateRequest v = run;
        v.recompute = Recompute::Selective;
        check("recompute_selective", v);
    }
    {
        EstimateRequest v = run;
        v.precision = Precision::BF16;
        check("precision_bf16", v);
    }
    {
        EstimateRequest v = run;
        v.optimizer = Optimizer::AdamW8bit;
        check("optimizer_8bit", v);
    }
    {
        EstimateRequest v = run;
        v.mode = Mode::Lora;
        check("lora", v);
    }

    const Remedy* mb = find(d, "micro_batch");
    const Remedy* rf = find(d, "recompute_full");
    const Remedy* rs = find(d, "recompute_selective");
    const Remedy* o8 = find(d, "optimizer_8bit");
    ASSERT_TRUE(mb && rf && rs && o8);
    EXPECT_GT(mb->saving->count(), 0);
    EXPECT_GT(*rf->saving, *rs->saving);
    EXPECT_GT(o8->saving->count(), 0);

    // Ranked: ranks 1..n in order; among the applicable fixes that address the
    // verdict, savings never increase down the list.
    for (std::size_t i = 0; i < d.remedies.size(); ++i) EXPECT_EQ(d.remedies[i].rank, static_cast<int>(i) + 1);
    std::optional<Bytes> prev;
    for (const auto& rem : d.remedies) {
        if (!rem.is_fix || !rem.applicable || !rem.addresses_verdict) continue;
        ASSERT_TRUE(rem.saving.has_value()) << rem.key;
        if (prev) {
            EXPECT_LE(*rem.saving, *prev) << rem.key;
        }
        prev = rem.saving;
    }
    // The addressing fixes come before everything else.
    bool seen_other = false;
    for (const auto& rem : d.remedies) {
        const bool addr = rem.is_fix && rem.applicable && rem.addresses_verdict;
        if (!addr) {
            seen_other = true;
        } else {
            EXPECT_FALSE(seen_other) << rem.key << " ranked after a non-addressing remedy";
        }
    }
    EXPECT_EQ(d.remedies.back().key, "empty_cache");
}

TEST(DoctorRender, AllFormats) {
    auto r = diagnose(kSeed001, std::nullopt);
    ASSERT_TRUE(r.ok());
    const DoctorResult& d = r.value();

    const auto j = nlohmann::json::parse(render_doctor(d, Format::Json));
    EXPECT_EQ(j["verdict"], "fragmented");
    EXPECT_EQ(j["message"]["requested"].get<std::int64_t>(), gib(1.24));
    EXPECT_EQ(j["message"]["wording"], "1.x");
    EXPECT_EQ(j["remedies"][0]["key"], "expandable_segments");
    EXPECT_TRUE(j["remedies"][0]["prediction"].is_null());
    EXPECT_TRUE(j["baseline"].is_null());

    const std::string text = render_doctor(d, Format::Text);
    EXPECT_NE(text.find("verdict: fragmented"), std::string::npos) << text;
    EXPECT_NE(text.find("3.87 GiB"), std::string::npos);
    EXPECT_NE(text.find("expandable_segments"), std::string::npos);
    EXPECT_NE(text.find("not a fix"), std::string::npos);

    const std::string md = render_doctor(d, Format::Markdown);
    EXPECT_NE(md.find("### OOM diagnosis: fragmented"), std::string::npos);
    EXPECT_NE(md.find("|---"), std::string::npos);

    const std::string csv = render_doctor(d, Format::Csv);
    EXPECT_EQ(csv.rfind("rank,remedy,title,saving_bytes,addresses_verdict,action,basis,is_fix,applicable\n", 0), 0u) << csv;
    EXPECT_EQ(static_cast<std::size_t>(std::count(csv.begin(), csv.end(), '\n')) >= d.remedies.size() + 1, true);
    EXPECT_NE(csv.find("1,expandable_segments,"), std::string::npos);
}

TEST(DoctorRender, WithRunShowsPredictions) {
    auto r = diagnose(kV2Full, llama_run());
    ASSERT_TRUE(r.ok()) << r.error().message;
    const auto j = doctor_to_json(r.value());
    ASSERT_FALSE(j["baseline"].is_null());
    EXPECT_EQ(j["baseline"]["model"].get<std::string>().empty(), false);
    bool any_prediction = false;
    for (const auto& rem : j["remedies"])
        if (!rem["prediction"].is_null()) {
            any_prediction = true;
            EXPECT_EQ(rem["saving"], rem["prediction"]["saving"]);
        }
    EXPECT_TRUE(any_prediction);
    const std::string text = render_doctor(r.value(), Format::Text);
    EXPECT_NE(text.find("baseline:"), std::string::npos);
    EXPECT_NE(text.find("fits_this_gpu"), std::string::npos);
}

// When no single remedy fits, the greedy combination is priced as one
// simulate_estimate() of all its settings together.
TEST(Doctor, CombinedRemediesMatchEstimate) {
    auto r = diagnose(kV2Full, llama_run());
    ASSERT_TRUE(r.ok()) << r.error().message;
    const DoctorResult& d = r.value();
    bool single_fits = false;
    for (const auto& rem : d.remedies) single_fits = single_fits || (rem.prediction && rem.prediction->fits_message_gpu);
    if (single_fits) {
        EXPECT_FALSE(d.combined.has_value());
        return;
    }
    ASSERT_TRUE(d.combined.has_value());
    const CombinedRemedy& c = *d.combined;
    ASSERT_GE(c.keys.size(), 2u);
    EstimateRequest req = llama_run();
    for (const auto& k : c.keys) {
        if (k == "micro_batch") { req.batch = 2; req.grad_accum = 2; }
        else if (k == "recompute_full") req.recompute = Recompute::Full;
        else if (k == "recompute_selective") req.recompute = Recompute::Selective;
        else if (k == "precision_bf16") req.precision = Precision::BF16;
        else if (k == "optimizer_8bit") req.optimizer = Optimizer::AdamW8bit;
        else if (k == "adafactor") req.optimizer = Optimizer::Adafactor;
        else if (k == "lora") req.mode = Mode::Lora;
        else FAIL() << "unexpected key " << k;
    }
    auto e = simulate_estimate(req);
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(c.prediction.total_device, e->per_gpu.total_device);
    EXPECT_EQ(c.prediction.fits_message_gpu, e->per_gpu.total_device <= d.numbers.total_capacity);
    // Each added remedy lowered the prediction below every single one it contains.
    for (const auto& k : c.keys) EXPECT_LE(c.prediction.peak_reserved, find(d, k)->prediction->peak_reserved) << k;
}
