// The OOM doctor: parses PyTorch's out-of-memory message and diagnoses it.
//
// Message formats verified against c10/cuda/CUDACachingAllocator.cpp
// (DeviceCachingAllocator::malloc, the TORCH_CHECK_WITH(OutOfMemoryError, ...)
// after the allocator has freed cached blocks and retried):
//   <= 2.0: "CUDA out of memory. Tried to allocate " S " (GPU " d "; " S
//           " total capacity; " S " already allocated; " S " free; "
//           [S " allowed; "] S " reserved in total by PyTorch)" [hint]
//   >= 2.1: "CUDA out of memory. Tried to allocate " S ". GPU " d " has a
//           total capacity of " S " of which " S " is free. " proc_info
//           [S " allowed; "] "Of the allocated memory " S " is allocated by
//           PyTorch, " ["with " S " allocated in private pools (e.g., CUDA
//           Graphs), "] "and " S " is reserved by PyTorch but unallocated."
//           proc_info = for each NVML compute process: ("Including non-PyTorch
//           memory, this process" | "Process " pid) " has " S " memory in use. "
//   (2.1 printed "total capacty"; recent main prints "Out of memory." from the
//   device-generic allocator.) format_size(): "<n> bytes" up to 1024, then
//   KiB / MiB / GiB with two decimals.
#include "gpumem/plan/doctor.hpp"
#include "gpumem/sim/simulate.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>

namespace gpumem {

namespace {

constexpr double kKiB = 1024.0;

// "1.24 GiB" with two decimals in GiB, the doctor's unit for people;
// format_bytes' smaller units below 1 GiB ("435.50 MiB", "512 B").
std::string gib(Bytes b) {
    if (b.count() < GiB(1).count() && b.count() > -GiB(1).count()) return format_bytes(b);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f GiB", b.gib());
    return buf;
}

// ---------------------------------------------------------------- parsing --

// Joins the lines, dropping per-line decorations that commonly surround a
// pasted message: torchrun's "[rank3]: " prefixes, Markdown/e-mail quote
// markers and code-comment hashes; collapses whitespace to single spaces.
std::string normalize(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    std::size_t i = 0;
    while (i <= text.size()) {
        std::size_t j = text.find('\n', i);
        if (j == std::string_view::npos) j = text.size();
        std::string_view line = text.substr(i, j - i);
        bool changed = true;
        while (changed) {
            changed = false;
            while (!line.empty() && (line.front() == ' ' || line.front() == '\t' || line.front() == '\r')) {
                line.remove_prefix(1);
                changed = true;
            }
            if (!line.empty() && (line.front() == '#' || line.front() == '>')) {
                line.remove_prefix(1);
                changed = true;
            }
            if (line.size() > 6 && line.substr(0, 5) == "[rank") {
                const std::size_t close = line.find("]:");
                if (close != std::string_view::npos && close < 12) {
                    line.remove_prefix(close + 2);
                    changed = true;
                }
            }
        }
        if (!out.empty()) out.push_back(' ');
        out.append(line);
        if (j == text.size()) break;
        i = j + 1;
    }
    std::string collapsed;
    collapsed.reserve(out.size());
    bool space = false;
    for (char c : out) {
        const bool ws = c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
        if (ws) {
            if (!space && !collapsed.empty()) collapsed.push_back(' ');
            space = true;
        } else {
            collapsed.push_back(c);
            space = false;
        }
    }
    while (!collapsed.empty() && collapsed.back() == ' ') collapsed.pop_back();
    return collapsed;
}

// A size as c10's format_size prints it (plus the spellings other
// allocators use). The number and unit are two capture groups.
const std::string kSize = R"(([0-9]+(?:\.[0-9]+)?)\s*(bytes|TiB|GiB|MiB|KiB|TB|GB|MB|KB|B)\b)";

// Bytes of a captured number and unit; nullopt when it does not fit 63 bits
// (NVML reports ULLONG_MAX, printed as 17179869184.00 GiB, when it has no value).
std::optional<Bytes> to_bytes(const std::string& number, const std::string& unit) {
    double mult = 1.0;
    if (unit == "KiB" || unit == "KB") mult = kKiB;
    else if (unit == "MiB" || unit == "MB") mult = kKiB * kKiB;
    else if (unit == "GiB" || unit == "GB") mult = kKiB * kKiB * kKiB;
    else if (unit == "TiB" || unit == "TB") mult = kKiB * kKiB * kKiB * kKiB;
    const double v = std::strtod(number.c_str(), nullptr) * mult;
    if (!std::isfinite(v) || v < 0.0 || v >= 9.0e18) return std::nullopt;
    return Bytes(static_cast<std::int64_t>(std::llround(v)));
}

std::regex re(const std::string& pattern) { return std::regex(pattern, std::regex::ECMAScript | std::regex::icase); }

bool search(const std::string& text, const std::regex& r, std::smatch& m) { return std::regex_search(text, m, r); }

std::size_t rfind_icase(const std::string& hay, std::string_view needle) {
    if (needle.size() > hay.size()) return std::string::npos;
    for (std::size_t i = hay.size() - needle.size() + 1; i-- > 0;) {
        bool ok = true;
        for (std::size_t k = 0; k < needle.size(); ++k) {
            const auto a = static_cast<unsigned char>(hay[i + k]);
            const auto b = static_cast<unsigned char>(needle[k]);
            if (std::tolower(a) != std::tolower(b)) {
                ok = false;
                break;
            }
        }
        if (ok) return i;
    }
    return std::string::npos;
}

Error parse_error(std::string message) { return Error{ErrorCode::ParseError, std::move(message), "message"}; }

const char* kExpected =
    "expected PyTorch's wording, either 'CUDA out of memory. Tried to allocate 1.24 GiB (GPU 0; 15.78 GiB total capacity; "
    "10.34 GiB already allocated; 435.50 MiB free; 14.21 GiB reserved in total by PyTorch)' (PyTorch <= 2.0) or "
    "'CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free. "
    "... Of the allocated memory 76.50 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated.' "
    "(PyTorch >= 2.1)";

}  // namespace

Bytes OomReport::outside_pytorch() const {
    const Bytes o = total_capacity - free - reserved;
    return o < Bytes(0) ? Bytes(0) : o;
}

Bytes OomReport::other_processes_total() const {
    Bytes s;
    for (const auto& p : other_processes) s += p.in_use;
    return s;
}

std::optional<Bytes> OomReport::this_process_non_pytorch() const {
    if (!this_process) return std::nullopt;
    const Bytes d = *this_process - reserved;
    return d < Bytes(0) ? Bytes(0) : d;
}

Result<OomReport> parse_oom_message(std::string_view raw) {
    return capture([&]() -> Result<OomReport> {
        const std::string all = normalize(raw);
        // A traceback can hold several messages (a caught OOM, then the fatal
        // one): read the last.
        const std::size_t at = rfind_icase(all, "Tried to allocate");
        if (at == std::string::npos) {
            if (rfind_icase(all, "out of memory") != std::string::npos)
                return parse_error("the text says 'out of memory' but has no 'Tried to allocate <size>': " + std::string(kExpected) +
                                   "; paste the whole message");
            return parse_error("not a PyTorch out-of-memory message (no 'CUDA out of memory. Tried to allocate ...'); " +
                               std::string(kExpected));
        }
        const std::size_t from = at > 240 ? at - 240 : 0;
        const std::string head = all.substr(from, at - from);
        const std::string text = all.substr(at, 4000);

        OomReport r;
        std::smatch m;

        // Exception type and device kind, from just before "Tried to allocate".
        {
            static const std::regex kind_re = re(R"(\b([A-Za-z0-9]+ )?out of memory\.?\s*$)");
            if (std::regex_search(head, m, kind_re) && m[1].matched) {
                std::string k = m[1].str();
                k.pop_back();
                const bool upper = std::all_of(k.begin(), k.end(), [](char c) { return !std::islower(static_cast<unsigned char>(c)); });
                r.device_kind = upper ? k : "CUDA";
            } else {
                r.device_kind = "CUDA";
            }
        }

        static const std::regex req_re = re("Tried to allocate " + kSize);
        if (!search(text, req_re, m)) return parse_error("cannot read the size after 'Tried to allocate'; " + std::string(kExpected));
        auto req = to_bytes(m[1].str(), m[2].str());
        if (!req) return parse_error("the requested size '" + m[1].str() + " " + m[2].str() + "' is out of range");
        r.requested = *req;

        std::vector<std::string> missing;
        auto read = [&](const std::regex& rx, int group, const char* what) -> std::optional<Bytes> {
            std::smatch mm;
            if (!std::regex_search(text, mm, rx)) {
                missing.emplace_back(what);
                return std::nullopt;
            }
            auto b = to_bytes(mm[group].str(), mm[group + 1].str());
            if (!b) {
                missing.push_back(std::string(what) + " (value out of range)");
                return std::nullopt;
            }
            return b;
        };
        auto optional_size = [&](const std::regex& rx, int group) -> std::optional<Bytes> {
            std::smatch mm;
            if (!std::regex_search(text, mm, rx)) return std::nullopt;
            return to_bytes(mm[group].str(), mm[group + 1].str());
        };

        static const std::regex v2_cap_re = re(R"(\b(?:GPU|Device|NPU|XPU)\s*([0-9]*)\s*has a total capac(?:i)?ty of )" + kSize +
                                               " of which " + kSize + " is free");
        static const std::regex v1_cap_re = re(R"(\(\s*(?:GPU|Device|NPU|XPU)\s*([0-9]*)\s*;\s*)" + kSize + " total capacity");
        static const std::regex allowed_re = re(kSize + R"(\s+allowed\s*;)");

        if (std::regex_search(text, m, v2_cap_re)) {
            r.wording = "2.x";
            if (m[1].length() > 0) r.gpu_index = std::stoi(m[1].str());
            auto total = to_bytes(m[2].str(), m[3].str());
            auto fr = to_bytes(m[4].str(), m[5].str());
            if (!total || !fr) return parse_error("the total capacity or free size is out of range");
            r.total_capacity = *total;
            r.free = *fr;
            static const std::regex alloc_re = re("Of the allocated memory " + kSize + " is allocated by PyTorch");
            static const std::regex unalloc_re = re(kSize + " is reserved by PyTorch but unallocated");
            static const std::regex pools_re = re("with " + kSize + " allocated in private pools");
            auto a = read(alloc_re, 1, "'Of the allocated memory X is allocated by PyTorch'");
            auto u = read(unalloc_re, 1, "'X is reserved by PyTorch but unallocated'");
            if (!missing.empty())
                return parse_error("the message has the 2.x header ('GPU N has a total capacity of ...') but lacks " + [&] {
                    std::string s;
                    for (std::size_t i = 0; i < missing.size(); ++i) s += (i ? " and " : "") + missing[i];
                    return s;
                }() + "; paste the whole message (it may have been cut off)");
            r.allocated = *a;
            r.reserved_unallocated = *u;
            r.reserved = *a + *u;
            r.private_pools = optional_size(pools_re, 1);
            r.allowed = optional_size(allowed_re, 1);

            static const std::regex this_re = re("this process has " + kSize + " memory in use");
            static const std::regex proc_re = re(R"(Process ([0-9]+) has )" + kSize + " memory in use");
            if (std::regex_search(text, m, this_re)) {
                auto b = to_bytes(m[1].str(), m[2].str());
                if (b && *b <= r.total_capacity * 2) r.this_process = *b;
                else r.notes.push_back("NVML reported no usable value for this process's memory (" + m[1].str() + " " + m[2].str() +
                                       ", typical of Windows/WSL); ignored");
            }
            for (auto it = std::sregex_iterator(text.begin(), text.end(), proc_re); it != std::sregex_iterator(); ++it) {
                const auto& pm = *it;
                auto b = to_bytes(pm[2].str(), pm[3].str());
                if (!b || *b > r.total_capacity * 2) {
                    r.notes.push_back("NVML reported no usable value for process " + pm[1].str() + " (" + pm[2].str() + " " + pm[3].str() +
                                      "); ignored");
                    continue;
                }
                r.other_processes.push_back(OomProcess{std::stoll(pm[1].str()), *b});
            }
            // In a container the PID namespace hides which line is this
            // process: every line reads "Process N". The one holding at least
            // PyTorch's reserved memory, the smallest such, is taken as ours.
            if (!r.this_process && !r.other_processes.empty()) {
                const Bytes slack = MiB(16);  // two-decimal rounding of the printed sizes
                std::optional<std::size_t> best;
                for (std::size_t i = 0; i < r.other_processes.size(); ++i) {
                    const Bytes u2 = r.other_processes[i].in_use;
                    if (u2 + slack < r.reserved) continue;
                    if (!best || u2 < r.other_processes[*best].in_use) best = i;
                }
                if (best) {
                    r.this_process = r.other_processes[*best].in_use;
                    r.this_process_inferred = true;
                    r.this_process_pid = r.other_processes[*best].pid;
                    r.notes.push_back("no 'this process' line (PID namespace): process " + std::to_string(*r.this_process_pid) +
                                      ", the smallest holding at least PyTorch's reserved memory, is taken as this process");
                    r.other_processes.erase(r.other_processes.begin() + static_cast<std::ptrdiff_t>(*best));
                }
            }
            return r;
        }

        if (std::regex_search(text, m, v1_cap_re)) {
            r.wording = "1.x";
            if (m[1].length() > 0) r.gpu_index = std::stoi(m[1].str());
            auto total = to_bytes(m[2].str(), m[3].str());
            if (!total) return parse_error("the total capacity is out of range");
            r.total_capacity = *total;
            static const std::regex alloc_re = re(kSize + " already allocated");
            static const std::regex free_re = re(R"(;\s*)" + kSize + R"(\s+free\b)");
            static const std::regex reserved_re = re(kSize + " reserved in total by PyTorch");
            auto a = read(alloc_re, 1, "'X already allocated'");
            auto f = read(free_re, 1, "'X free'");
            auto res = read(reserved_re, 1, "'X reserved in total by PyTorch'");
            if (!missing.empty())
                return parse_error("the message has the 1.x header ('(GPU N; X total capacity; ...') but lacks " + [&] {
                    std::string s;
                    for (std::size_t i = 0; i < missing.size(); ++i) s += (i ? " and " : "") + missing[i];
                    return s;
                }() + "; paste the whole message (it may have been cut off)");
            r.allocated = *a;
            r.free = *f;
            r.reserved = *res;
            r.reserved_unallocated = *res > *a ? *res - *a : Bytes(0);
            r.allowed = optional_size(allowed_re, 1);
            return r;
        }

        return parse_error("the message stops after 'Tried to allocate " + format_bytes(r.requested) +
                           "' without the memory statistics (total capacity, free, allocated, reserved); " + std::string(kExpected) +
                           ". Paste the whole message; some builds truncate it (pytorch/pytorch#126766)");
    });
}

// ------------------------------------------------------------- diagnosis --

const char* to_string(OomVerdict v) {
    switch (v) {
        case OomVerdict::Fragmented: return "fragmented";
        case OomVerdict::Full: return "full";
        case OomVerdict::OutsidePytorch: return "outside-pytorch";
    }
    return "full";
}

std::int64_t suggested_max_split_size_mb(Bytes requested) {
    const std::int64_t mib = requested.count() / (1024 * 1024);
    std::int64_t p = 32;
    while (p * 2 <= mib && p < (std::int64_t{1} << 40)) p *= 2;
    return p;
}

namespace {

// What a CUDA context and the libraries around PyTorch normally hold outside
// the caching allocator (gpu_catalog's contexts are 0.3-1 GiB; cuBLAS/cuDNN
// workspaces and NCCL buffers add some). Beyond this, outside memory is
// something the user can reclaim.
constexpr Bytes kContextAllowance = GiB(1);

// Order used to break ties between remedies with equal standing.
int preference(const std::string& key) {
    static const std::array<const char*, 13> order = {
        "expandable_segments", "max_split_size", "free_outside_memory", "micro_batch", "recompute_full", "recompute_selective",
        "precision_bf16", "precision_amp_bf16", "optimizer_8bit", "adafactor", "lora", "bigger_gpu", "empty_cache"};
    for (std::size_t i = 0; i < order.size(); ++i)
        if (key == order[i]) return static_cast<int>(i);
    return static_cast<int>(order.size());
}

bool is_training(Mode m) { return m != Mode::Infer; }

RemedyPrediction predict(const EstimateResult& e, const DoctorBaseline& base, const DoctorNumbers& n) {
    RemedyPrediction p;
    p.request = e.request;
    p.peak_allocated = e.per_gpu.peak_allocated;
    p.peak_reserved = e.per_gpu.peak_reserved;
    p.total_device = e.per_gpu.total_device;
    p.saving = base.peak_reserved - e.per_gpu.peak_reserved;
    p.fits_message_gpu = e.per_gpu.total_device <= n.total_capacity - n.other_processes;
    return p;
}

struct Variant {
    std::string key;
    std::string title;
    std::string action;
    EstimateRequest req;
};

std::string join(const std::vector<std::string>& v, const std::string& sep) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
    return s;
}

// The setting a model-side remedy changes; one remedy per setting is combined.
std::string setting_of(const std::string& key) {
    if (key == "micro_batch") return "batch";
    if (key.rfind("recompute", 0) == 0) return "recompute";
    if (key.rfind("precision", 0) == 0) return "precision";
    if (key == "optimizer_8bit" || key == "adafactor") return "optimizer";
    if (key == "lora") return "mode";
    return key;
}

void apply_setting(EstimateRequest& to, const EstimateRequest& from, const std::string& setting) {
    if (setting == "batch") {
        to.batch = from.batch;
        to.grad_accum = from.grad_accum;
    } else if (setting == "recompute") {
        to.recompute = from.recompute;
    } else if (setting == "precision") {
        to.precision = from.precision;
    } else if (setting == "optimizer") {
        to.optimizer = from.optimizer;
    } else if (setting == "mode") {
        to.mode = from.mode;
    }
}

// Greedy: remedies with a positive predicted saving, in rank order, one per
// setting, each kept only if estimate() accepts the combination; stops at the
// first combination that fits.
std::optional<CombinedRemedy> combine(const DoctorResult& d, const std::vector<Variant>& priced, const DoctorNumbers& n) {
    if (!d.baseline) return std::nullopt;
    EstimateRequest cur = d.baseline->request;
    std::optional<CombinedRemedy> out;
    std::vector<std::string> used;
    for (const auto& r : d.remedies) {
        if (!r.prediction || !r.applicable || r.prediction->saving <= Bytes(0)) continue;
        const std::string setting = setting_of(r.key);
        if (std::find(used.begin(), used.end(), setting) != used.end()) continue;
        auto v = std::find_if(priced.begin(), priced.end(), [&](const Variant& x) { return x.key == r.key; });
        if (v == priced.end()) continue;
        EstimateRequest next = cur;
        apply_setting(next, v->req, setting);
        auto e = simulate_estimate(next);
        if (!e) continue;
        used.push_back(setting);
        cur = next;
        if (!out) out = CombinedRemedy{};
        out->keys.push_back(r.key);
        out->actions.push_back(r.action);
        out->prediction = predict(e.value(), *d.baseline, n);
        if (out->prediction.fits_message_gpu) break;
    }
    if (out && out->keys.size() < 2) return std::nullopt;  // a single remedy is already listed
    return out;
}

}  // namespace

Result<DoctorResult> diagnose(std::string_view message, const std::optional<EstimateRequest>& run) {
    auto parsed = parse_oom_message(message);
    if (!parsed) return parsed.error();
    return capture([&]() -> Result<DoctorResult> {
        DoctorResult d;
        d.oom = std::move(parsed).value();
        const OomReport& o = d.oom;
        DoctorNumbers& n = d.numbers;
        n.requested = o.requested;
        n.total_capacity = o.total_capacity;
        n.free = o.free;
        n.allocated = o.allocated;
        n.reserved = o.reserved;
        n.cached = o.reserved_unallocated;
        n.outside_pytorch = o.outside_pytorch();
        n.usable = n.total_capacity - n.outside_pytorch;
        if (o.allowed && *o.allowed < n.usable) n.usable = *o.allowed;
        n.shortfall = n.allocated + n.requested - n.usable;
        n.other_processes = o.other_processes_total();

        // Headroom PyTorch would need left after the request for the step to
        // go on; below it the device counts as full even if the request
        // alone would squeeze into free + cached memory.
        const Bytes margin = max(MiB(256), Bytes(n.total_capacity.count() / 100));
        const Bytes avoidable_outside = n.outside_pytorch > kContextAllowance ? n.outside_pytorch - kContextAllowance : Bytes(0);
        const Bytes ten_percent = Bytes(n.total_capacity.count() / 10);
        const bool cached_holds_request = n.cached >= n.requested;
        const bool fits_without_outside = n.allocated + n.requested + margin <= n.total_capacity - kContextAllowance;
        const bool outside_large = avoidable_outside >= ten_percent && avoidable_outside > Bytes(0);
        const bool no_headroom = n.shortfall + margin > Bytes(0);

        if (cached_holds_request) d.verdict = OomVerdict::Fragmented;
        else if (outside_large && fits_without_outside) d.verdict = OomVerdict::OutsidePytorch;
        else if (no_headroom) d.verdict = OomVerdict::Full;
        else d.verdict = OomVerdict::Fragmented;  // free + cached covers it with room to spare: the cache is what is missing

        // ---- headline and explanation
        const std::string R = gib(n.reserved), A = gib(n.allocated), C = gib(n.cached), X = gib(n.requested), F = gib(n.free),
                          T = gib(n.total_capacity), O = gib(n.outside_pytorch), U = gib(n.usable);
        switch (d.verdict) {
            case OomVerdict::Fragmented:
                d.headline = cached_holds_request
                                 ? "fragmented: " + C + " reserved but unallocated >= the " + X + " requested"
                                 : "fragmented: " + C + " reserved but unallocated plus " + F + " free would hold the " + X + " requested";
                d.explanation =
                    "PyTorch had reserved " + R + " from the driver but only " + A + " of it was in live tensors; the other " + C +
                    " is cached in blocks split off segments that still hold live tensors, and no single free block was " + X +
                    ". Before raising this error the caching allocator had already released every wholly free segment and retried, "
                    "and the driver had only " + F + " free, so the request failed although the memory exists. This is fragmentation, "
                    "not a model that is too large: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets the allocator grow one "
                    "segment per stream and remap freed pages, which makes that cached memory usable for any size; max_split_size_mb "
                    "stops large cached blocks from being split by small requests. torch.cuda.empty_cache() does not help (see below).";
                break;
            case OomVerdict::Full:
                d.headline = "full: " + A + " live + " + X + " requested exceeds the " + U + " PyTorch can use on this " + T + " GPU" +
                             (n.shortfall > Bytes(0) ? " (short by " + gib(n.shortfall) + ")" : " (less than " + gib(margin) + " would be left)");
                d.explanation =
                    "Live tensors held " + A + " of the " + U + " PyTorch can use on this GPU (" + T + " total minus " + O +
                    " used outside its allocator" + (o.allowed ? ", capped at " + gib(*o.allowed) + " by the process memory fraction" : "") +
                    "); the " + X + " request brings that to " + gib(n.allocated + n.requested) +
                    ". Only " + C + " was cached (reserved but unallocated), too little for allocator settings to recover the difference, "
                    "so the job itself has to use less memory at its peak: a smaller micro-batch with gradient accumulation, activation "
                    "recompute, lower-precision weights and optimizer states, an 8-bit or factored optimizer, or LoRA; or more/larger GPUs.";
                break;
            case OomVerdict::OutsidePytorch:
                d.headline = "outside-pytorch: " + O + " of the " + T + " GPU is held outside PyTorch's allocator, leaving " + U +
                             " for " + A + " live + " + X + " requested";
                d.explanation =
                    "Of the " + T + " on this GPU, " + O + " is used outside PyTorch's caching allocator" +
                    (n.other_processes > Bytes(0) ? " (" + gib(n.other_processes) + " by " + std::to_string(o.other_processes.size()) +
                                                        " other process" + (o.other_processes.size() == 1 ? "" : "es") + ")"
                                                  : "") +
                    ", far more than a CUDA context (~" + gib(kContextAllowance) + "). Live tensors (" + A + ") plus the request (" + X +
                    ") would fit without it, so the memory held elsewhere is what is missing: stop or move the other processes "
                    "(nvidia-smi lists them; a DataLoader worker or a second job on the same GPU is typical), free memory held by "
                    "non-PyTorch libraries, or select an idle GPU with CUDA_VISIBLE_DEVICES.";
                break;
        }

        // ---- findings (deterministic order)
        if (o.wording == "1.x")
            d.findings.push_back("message wording is PyTorch <= 2.0's; expandable_segments needs PyTorch >= 2.1");
        if (n.requested > n.total_capacity)
            d.findings.push_back("the single allocation (" + X + ") is larger than the whole GPU (" + T +
                                 "): no setting fixes this; check the tensor's shape, or chunk or shard the computation");
        if (n.free >= n.requested)
            d.findings.push_back("the driver reported " + F + " free, at least the request: the allocation was refused by a memory cap " +
                                 "(set_per_process_memory_fraction) or the memory was taken between the failure and the report");
        if (o.allowed)
            d.findings.push_back("a per-process memory fraction caps PyTorch at " + gib(*o.allowed) +
                                 " (torch.cuda.set_per_process_memory_fraction)");
        if (o.private_pools)
            d.findings.push_back(gib(*o.private_pools) + " of the allocated memory is in CUDA Graph private pools");
        if (!o.other_processes.empty()) {
            std::vector<std::string> ps;
            for (const auto& p : o.other_processes) ps.push_back(std::to_string(p.pid) + ": " + gib(p.in_use));
            d.findings.push_back(std::to_string(o.other_processes.size()) + " other process" + (o.other_processes.size() == 1 ? "" : "es") +
                                 " on this GPU hold " + gib(n.other_processes) + " (" + join(ps, ", ") + ")");
        }
        if (auto np = o.this_process_non_pytorch())
            d.findings.push_back("this process holds " + gib(*np) +
                                 " outside PyTorch's allocator (CUDA context, NCCL, cuBLAS/cuDNN workspaces, other libraries)");
        if (d.verdict != OomVerdict::Fragmented && n.cached >= ten_percent)
            d.findings.push_back(C + " is reserved but unallocated (" +
                                 std::to_string(static_cast<int>(std::lround(100.0 * static_cast<double>(n.cached.count()) /
                                                                             static_cast<double>(std::max<std::int64_t>(1, n.reserved.count()))))) +
                                 "% of reserved): fragmentation adds to the problem");
        if (d.verdict != OomVerdict::OutsidePytorch && outside_large)
            d.findings.push_back(O + " is used outside PyTorch's allocator, more than a CUDA context needs");
        for (const auto& note : o.notes) d.notes.push_back(note);

        // ---- remedies
        std::vector<Remedy> rem;
        std::vector<Variant> priced;  // model-side variants estimate() accepted
        const bool frag = d.verdict == OomVerdict::Fragmented;
        {
            Remedy r;
            r.key = "expandable_segments";
            r.title = "expandable segments";
            r.action = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True";
            r.saving = n.cached;
            r.basis = "recovers up to the " + C + " reserved but unallocated: one growing segment per stream whose freed pages are reused "
                      "for any size" + std::string(o.wording == "1.x" ? "; needs PyTorch >= 2.1" : "");
            r.addresses_verdict = frag;
            rem.push_back(r);
        }
        {
            Remedy r;
            const std::int64_t mb = suggested_max_split_size_mb(n.requested);
            r.key = "max_split_size";
            r.title = "max_split_size_mb";
            r.action = "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:" + std::to_string(mb);
            r.saving = n.cached;
            r.basis = "up to the " + C + " reserved but unallocated: cached blocks of " + std::to_string(mb) +
                      " MiB or more are no longer split by smaller requests, so they stay whole for requests like this " + X +
                      " one; prevents rather than repairs fragmentation";
            r.addresses_verdict = frag;
            rem.push_back(r);
        }
        if (outside_large || n.other_processes >= MiB(256)) {
            Remedy r;
            r.key = "free_outside_memory";
            r.title = "free memory held outside PyTorch";
            r.action = n.other_processes > Bytes(0)
                           ? "stop or move the other processes on this GPU (nvidia-smi), or pick an idle GPU with CUDA_VISIBLE_DEVICES"
                           : "find what this process allocates outside PyTorch (NCCL buffers, cuDNN/cuBLAS workspaces, other CUDA libraries)";
            r.saving = max(avoidable_outside, n.other_processes);
            r.basis = "the " + gib(*r.saving) + " used outside the allocator beyond a ~" + gib(kContextAllowance) + " CUDA context";
            r.addresses_verdict = d.verdict == OomVerdict::OutsidePytorch;
            rem.push_back(r);
        }

        const bool model_addresses = d.verdict == OomVerdict::Full;
        auto generic = [&](std::string key, std::string title, std::string action, std::string basis) {
            Remedy r;
            r.key = std::move(key);
            r.title = std::move(title);
            r.action = std::move(action);
            r.basis = std::move(basis) + " (not quantified without --model)";
            r.addresses_verdict = model_addresses;
            rem.push_back(r);
        };

        if (!run) {
            d.notes.push_back("no --model given: model-side savings are not quantified; pass --model and the run's settings (--batch, --seq, ...) to price each remedy with gpumem's estimate");
            generic("micro_batch", "halve the micro-batch, double gradient accumulation", "--batch B/2 --grad-accum 2*G",
                    "halving the micro-batch roughly halves the saved activations (and the logits); the global batch is unchanged");
            generic("recompute_full", "full activation recompute", "model.gradient_checkpointing_enable() / --recompute full",
                    "keeps only each layer's input and recomputes the rest in backward: activations drop to a small fraction, "
                    "~30% more compute");
            generic("recompute_selective", "selective activation recompute", "--recompute selective",
                    "recomputes the attention internals only; saves less than full recompute");
            generic("precision_bf16", "bf16 weights and optimizer states", "--precision bf16",
                    "pure bf16 halves weights, gradients and optimizer states against fp32 (AMP keeps fp32 master weights)");
            generic("optimizer_8bit", "8-bit AdamW (bitsandbytes)", "--optimizer adamw-8bit",
                    "Adam moments in 8 bits: 2 bytes instead of 8 per parameter");
            generic("adafactor", "Adafactor", "--optimizer adafactor",
                    "factored second moment, no first moment: optimizer state a small fraction of Adam's");
            generic("lora", "LoRA", "--mode lora",
                    "frozen base weights need no gradients or optimizer states; only the adapters train");
        } else {
            auto base_res = simulate_estimate(*run);
            if (!base_res) return base_res.error();
            const EstimateResult& base = base_res.value();
            DoctorBaseline b;
            b.request = base.request;
            b.model_name = base.model_name;
            b.peak_allocated = base.per_gpu.peak_allocated;
            b.peak_reserved = base.per_gpu.peak_reserved;
            b.total_device = base.per_gpu.total_device;
            b.fits_message_gpu = b.total_device <= n.total_capacity - n.other_processes;
            d.baseline = b;
            if (b.peak_allocated + MiB(64) < n.allocated + n.requested)
                d.findings.push_back("gpumem predicts a peak of " + gib(b.peak_allocated) + " allocated for " + b.model_name +
                                     " with these settings, below the " + gib(n.allocated + n.requested) +
                                     " the message shows was needed: the failing run differs from the settings given "
                                     "(longer sequences, larger batch, tensors kept alive across steps?)");
            else if (!b.fits_message_gpu && d.verdict != OomVerdict::Full)
                d.findings.push_back("gpumem predicts " + gib(b.total_device) + " on the device for these settings, more than this " + T +
                                     " GPU: fixing the " + std::string(to_string(d.verdict)) +
                                     " failure alone will not be enough; see the model-side remedies");
            else if (b.fits_message_gpu)
                d.findings.push_back("gpumem predicts these settings fit this GPU (" + gib(b.total_device) + " of " + T +
                                     "): the failure is likely a transient peak, fragmentation or a longer-than-usual batch");

            const EstimateRequest& br = base.request;
            const bool train = is_training(br.mode);
            const Precision prec = br.precision.value_or(train ? Precision::AmpBF16 : Precision::BF16);
            std::vector<Variant> vars;
            {
                Variant v{"micro_batch", "", "", br};
                if (br.batch >= 2) {
                    v.req.batch = br.batch / 2;
                    if (train) {
                        v.req.grad_accum = br.grad_accum * 2;
                        v.title = "halve the micro-batch, double gradient accumulation";
                        v.action = "--batch " + std::to_string(v.req.batch) + " --grad-accum " + std::to_string(v.req.grad_accum);
                    } else {
                        v.title = "halve the batch";
                        v.action = "--batch " + std::to_string(v.req.batch);
                    }
                    vars.push_back(v);
                } else {
                    Remedy r;
                    r.key = "micro_batch";
                    r.title = "halve the micro-batch";
                    r.action = "--batch 1 already";
                    r.applicable = false;
                    r.basis = "the micro-batch is already 1; shorten the sequence or use recompute";
                    rem.push_back(r);
                }
            }
            if (train) {
                if (br.recompute != Recompute::Full) {
                    Variant v{"recompute_full", "full activation recompute", "--recompute full (model.gradient_checkpointing_enable())", br};
                    v.req.recompute = Recompute::Full;
                    vars.push_back(v);
                }
                if (br.recompute == Recompute::None) {
                    Variant v{"recompute_selective", "selective activation recompute", "--recompute selective", br};
                    v.req.recompute = Recompute::Selective;
                    vars.push_back(v);
                }
                if (prec == Precision::FP32) {
                    Variant v{"precision_amp_bf16", "bf16 autocast (AMP)", "--precision amp-bf16", br};
                    v.req.precision = Precision::AmpBF16;
                    vars.push_back(v);
                }
                if (prec == Precision::FP32 || prec == Precision::AmpBF16 || prec == Precision::AmpFP16) {
                    Variant v{"precision_bf16", "bf16 weights and optimizer states", "--precision bf16", br};
                    v.req.precision = Precision::BF16;
                    vars.push_back(v);
                }
                if (br.optimizer == Optimizer::Adam || br.optimizer == Optimizer::AdamW) {
                    Variant v{"optimizer_8bit", "8-bit AdamW (bitsandbytes)", "--optimizer adamw-8bit", br};
                    v.req.optimizer = Optimizer::AdamW8bit;
                    vars.push_back(v);
                    Variant a{"adafactor", "Adafactor", "--optimizer adafactor", br};
                    a.req.optimizer = Optimizer::Adafactor;
                    vars.push_back(a);
                }
                if (br.mode == Mode::Train) {
                    Variant v{"lora", "LoRA", "--mode lora --lora-rank " + std::to_string(br.lora_rank), br};
                    v.req.mode = Mode::Lora;
                    vars.push_back(v);
                }
            } else if (prec == Precision::FP32) {
                Variant v{"precision_bf16", "bf16 weights", "--precision bf16", br};
                v.req.precision = Precision::BF16;
                vars.push_back(v);
            }
            // Allocator settings priced by replaying the simulated step with them.
            for (auto& r : rem) {
                if (r.key != "expandable_segments" && r.key != "max_split_size") continue;
                EstimateRequest q = br;
                const std::string setting = r.action.substr(r.action.find('=') + 1);
                q.alloc_conf = br.alloc_conf.empty() ? setting : br.alloc_conf + "," + setting;
                auto e = simulate_estimate(q);
                if (!e) continue;
                r.prediction = predict(e.value(), b, n);
                r.saving = r.prediction->saving;
                r.basis += "; gpumem simulation of this run: peak reserved " + gib(r.prediction->peak_reserved) + " vs " +
                           gib(b.peak_reserved);
            }
            for (const auto& v : vars) {
                Remedy r;
                r.key = v.key;
                r.title = v.title;
                r.action = v.action;
                auto e = simulate_estimate(v.req);
                if (!e) {
                    r.applicable = false;
                    r.basis = "estimate rejected this variant: " + e.error().message;
                    rem.push_back(r);
                    continue;
                }
                r.prediction = predict(e.value(), b, n);
                r.saving = r.prediction->saving;
                r.basis = "gpumem simulation: peak reserved " + gib(r.prediction->peak_reserved) + " vs " + gib(b.peak_reserved) +
                          " for the run as given";
                r.addresses_verdict = model_addresses && r.prediction->saving > Bytes(0);
                rem.push_back(r);
                priced.push_back(v);
            }
        }
        {
            Remedy r;
            r.key = "empty_cache";
            r.title = "torch.cuda.empty_cache()";
            r.action = "none: not a fix";
            r.saving = Bytes(0);
            r.is_fix = false;
            r.basis = "the allocator already released every wholly free cached segment (what empty_cache() does) and retried before "
                      "raising this error; the " + C + " still reserved sits in segments that also hold live tensors, which "
                      "empty_cache() cannot release. Calling it only makes later allocations slower (cudaMalloc/cudaFree synchronize)";
            rem.push_back(r);
        }

        // ---- rank: real, applicable fixes first; those that address the
        // verdict before those that do not; then by saving (known before
        // unknown, larger first); ties by a fixed preference.
        std::stable_sort(rem.begin(), rem.end(), [](const Remedy& a, const Remedy& b) {
            const bool ua = a.is_fix && a.applicable, ub = b.is_fix && b.applicable;
            if (ua != ub) return ua;
            if (a.addresses_verdict != b.addresses_verdict) return a.addresses_verdict;
            if (a.saving.has_value() != b.saving.has_value()) return a.saving.has_value();
            if (a.saving && b.saving && *a.saving != *b.saving) return *a.saving > *b.saving;
            return preference(a.key) < preference(b.key);
        });
        for (std::size_t i = 0; i < rem.size(); ++i) rem[i].rank = static_cast<int>(i) + 1;
        d.remedies = std::move(rem);

        if (d.baseline) {
            std::vector<std::string> fit;
            for (const auto& r : d.remedies)
                if (r.prediction && r.prediction->fits_message_gpu) fit.push_back(r.key);
            if (!fit.empty()) {
                d.notes.push_back("predicted to fit this " + T + " GPU: " + join(fit, ", "));
            } else {
                d.combined = combine(d, priced, n);
                if (d.combined && d.combined->prediction.fits_message_gpu)
                    d.notes.push_back("no single model-side remedy is predicted to fit this " + T + " GPU; together " +
                                      join(d.combined->keys, " + ") + " are (" + gib(d.combined->prediction.total_device) + ")");
                else
                    d.notes.push_back("no model-side remedy, alone or combined, is predicted to fit this " + T +
                                      " GPU: use more GPUs (sharding: ZeRO/FSDP) or a larger GPU");
            }
        }
        return d;
    });
}

}  // namespace gpumem
