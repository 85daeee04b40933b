// The OOM doctor, part 1: reads PyTorch's out-of-memory message into an
// OomReport (the numbers diagnose() works from).
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
#include "gpumem/core/input.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <regex>

namespace gpumem {

namespace {

constexpr double kKiB = 1024.0;

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

// The device number and PIDs the message prints, range-checked: a number too
// large for its field is bad input (exit 2 naming it), not an internal error.
int gpu_index(const std::string& digits) {
    return static_cast<int>(parse_int_in_range(digits, "GPU index in the message", 0, std::numeric_limits<int>::max()));
}
std::int64_t process_id(const std::string& digits) {
    return parse_int_in_range(digits, "process id in the message", 0, std::numeric_limits<std::int64_t>::max());
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
            if (m[1].length() > 0) r.gpu_index = gpu_index(m[1].str());
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
                r.other_processes.push_back(OomProcess{process_id(pm[1].str()), *b});
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
            if (m[1].length() > 0) r.gpu_index = gpu_index(m[1].str());
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

}  // namespace gpumem
