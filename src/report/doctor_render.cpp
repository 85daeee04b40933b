#include "gpumem/report/doctor_render.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gpumem {

namespace {

// GiB for people; format_bytes' smaller units below 1 GiB.
std::string gib(Bytes b) {
    if (b.count() < GiB(1).count() && b.count() > -GiB(1).count()) return format_bytes(b);
    return fmt::format("{:.2f} GiB", b.gib());
}

nlohmann::json opt_bytes(const std::optional<Bytes>& b) { return b ? nlohmann::json(b->count()) : nlohmann::json(nullptr); }

// Greedy word wrap at `width` columns, each line prefixed by `indent`.
std::string wrap(const std::string& s, std::size_t width, const std::string& indent) {
    std::string out, line;
    std::size_t i = 0;
    while (i < s.size()) {
        std::size_t j = s.find(' ', i);
        if (j == std::string::npos) j = s.size();
        const std::string word = s.substr(i, j - i);
        if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
            out += indent + line + "\n";
            line.clear();
        }
        line += (line.empty() ? "" : " ") + word;
        i = j + 1;
    }
    if (!line.empty()) out += indent + line + "\n";
    return out;
}

std::string wording_label(const std::string& w) {
    if (w == "1.x") return "PyTorch <= 2.0 wording";
    if (w == "2.x") return "PyTorch >= 2.1 wording";
    return w;
}

std::string gpu_label(const OomReport& o) {
    return (o.device_kind.empty() || o.device_kind == "CUDA" ? std::string("GPU") : o.device_kind + " device") +
           (o.gpu_index ? " " + std::to_string(*o.gpu_index) : std::string());
}

Table numbers_table(const DoctorResult& d) {
    const DoctorNumbers& n = d.numbers;
    const OomReport& o = d.oom;
    Table t;
    t.header = {"quantity", "size", "source"};
    t.right_align = {false, true, false};
    t.rows.push_back({"requested", gib(n.requested), "Tried to allocate"});
    t.rows.push_back({"total capacity", gib(n.total_capacity), "cudaMemGetInfo total"});
    t.rows.push_back({"free", gib(n.free), "cudaMemGetInfo free at the failure"});
    t.rows.push_back({"allocated by PyTorch", gib(n.allocated), "live tensors"});
    t.rows.push_back({"reserved by PyTorch", gib(n.reserved), o.wording == "2.x" ? "allocated + reserved but unallocated" : "printed"});
    t.rows.push_back({"reserved but unallocated", gib(n.cached), o.wording == "2.x" ? "printed" : "reserved - allocated"});
    t.rows.push_back({"outside PyTorch", gib(n.outside_pytorch), "total - free - reserved"});
    t.rows.push_back({"usable by PyTorch", gib(n.usable), o.allowed ? "min(free + reserved, allowed)" : "free + reserved"});
    if (o.allowed) t.rows.push_back({"allowed (memory fraction)", gib(*o.allowed), "printed"});
    if (o.private_pools) t.rows.push_back({"in CUDA Graph private pools", gib(*o.private_pools), "printed"});
    if (o.this_process)
        t.rows.push_back({"this process (nvidia-smi)", gib(*o.this_process),
                          o.this_process_inferred ? "inferred: process " + std::to_string(o.this_process_pid.value_or(0)) : "printed"});
    if (auto np = o.this_process_non_pytorch()) t.rows.push_back({"this process outside PyTorch", gib(*np), "this process - reserved"});
    if (!o.other_processes.empty())
        t.rows.push_back({"other processes", gib(n.other_processes), std::to_string(o.other_processes.size()) + " listed by NVML"});
    return t;
}

Table remedies_table(const DoctorResult& d, bool with_basis, bool csv) {
    const bool pred = d.baseline.has_value();
    Table t;
    t.header = {"rank", "remedy", csv ? "saving_bytes" : "saving", "addresses_verdict"};
    t.right_align = {true, false, true, false};
    if (pred) {
        for (const char* h : {"peak_reserved", "total_device", "fits_this_gpu"}) t.header.push_back(h);
        for (bool b : {true, true, false}) t.right_align.push_back(b);
    }
    t.header.push_back("action");
    t.right_align.push_back(false);
    if (with_basis) {
        t.header.push_back("basis");
        t.right_align.push_back(false);
    }
    if (csv) {
        t.header.insert(t.header.begin() + 2, "title");
        t.right_align.insert(t.right_align.begin() + 2, false);
        t.header.push_back("is_fix");
        t.header.push_back("applicable");
    }
    for (const auto& r : d.remedies) {
        std::vector<std::string> row;
        row.push_back(std::to_string(r.rank));
        row.push_back(r.key);
        if (csv) row.push_back(r.title);
        if (csv) row.push_back(r.saving ? std::to_string(r.saving->count()) : "");
        else row.push_back(!r.applicable ? "n/a" : r.saving ? gib(*r.saving) : "unknown");
        row.push_back(!r.is_fix ? (csv ? "false" : "not a fix") : r.addresses_verdict ? (csv ? "true" : "yes") : (csv ? "false" : "no"));
        if (pred) {
            if (r.prediction) {
                row.push_back(csv ? std::to_string(r.prediction->peak_reserved.count()) : gib(r.prediction->peak_reserved));
                row.push_back(csv ? std::to_string(r.prediction->total_device.count()) : gib(r.prediction->total_device));
                row.push_back(r.prediction->fits_message_gpu ? (csv ? "true" : "yes") : (csv ? "false" : "no"));
            } else {
                row.insert(row.end(), {"", "", ""});
            }
        }
        row.push_back(r.action);
        if (with_basis) row.push_back(r.basis);
        if (csv) {
            row.push_back(r.is_fix ? "true" : "false");
            row.push_back(r.applicable ? "true" : "false");
        }
        t.rows.push_back(std::move(row));
    }
    return t;
}

std::string baseline_line(const DoctorResult& d) {
    const DoctorBaseline& b = *d.baseline;
    return fmt::format("{} as given (batch {}, grad-accum {}, {}, recompute {}, {}): peak reserved {}, total device {}, {} this {} GPU",
                       b.model_name, b.request.batch, b.request.grad_accum, to_string(b.request.mode), to_string(b.request.recompute),
                       b.request.precision ? to_string(*b.request.precision) : "default precision", gib(b.peak_reserved),
                       gib(b.total_device), b.fits_message_gpu ? "fits" : "does not fit", gib(d.numbers.total_capacity));
}

std::string combined_line(const DoctorResult& d) {
    const CombinedRemedy& c = *d.combined;
    std::string keys;
    for (std::size_t i = 0; i < c.keys.size(); ++i) keys += (i ? " + " : "") + c.keys[i];
    std::string actions;
    for (std::size_t i = 0; i < c.actions.size(); ++i) actions += (i ? " " : "") + c.actions[i];
    return fmt::format("{}: peak reserved {}, total device {} ({} saved), {} this {} GPU; {}", keys, gib(c.prediction.peak_reserved),
                       gib(c.prediction.total_device), gib(c.prediction.saving), c.prediction.fits_message_gpu ? "fits" : "does not fit",
                       gib(d.numbers.total_capacity), actions);
}

nlohmann::json prediction_to_json(const RemedyPrediction& p) {
    return {
        {"request", request_to_json(p.request)},
        {"peak_allocated", p.peak_allocated.count()},
        {"peak_reserved", p.peak_reserved.count()},
        {"total_device", p.total_device.count()},
        {"saving", p.saving.count()},
        {"fits_message_gpu", p.fits_message_gpu},
    };
}

}  // namespace

nlohmann::json oom_report_to_json(const OomReport& o) {
    nlohmann::json j;
    j["wording"] = o.wording;
    j["device_kind"] = o.device_kind;
    j["gpu_index"] = o.gpu_index ? nlohmann::json(*o.gpu_index) : nlohmann::json(nullptr);
    j["requested"] = o.requested.count();
    j["total_capacity"] = o.total_capacity.count();
    j["free"] = o.free.count();
    j["allocated"] = o.allocated.count();
    j["reserved"] = o.reserved.count();
    j["reserved_unallocated"] = o.reserved_unallocated.count();
    j["allowed"] = opt_bytes(o.allowed);
    j["private_pools"] = opt_bytes(o.private_pools);
    j["this_process"] = opt_bytes(o.this_process);
    j["this_process_inferred"] = o.this_process_inferred;
    j["this_process_pid"] = o.this_process_pid ? nlohmann::json(*o.this_process_pid) : nlohmann::json(nullptr);
    j["other_processes"] = nlohmann::json::array();
    for (const auto& p : o.other_processes) j["other_processes"].push_back({{"pid", p.pid}, {"in_use", p.in_use.count()}});
    j["outside_pytorch"] = o.outside_pytorch().count();
    j["notes"] = o.notes;
    return j;
}

nlohmann::json doctor_to_json(const DoctorResult& d) {
    nlohmann::json j;
    j["verdict"] = to_string(d.verdict);
    j["headline"] = d.headline;
    j["explanation"] = d.explanation;
    j["message"] = oom_report_to_json(d.oom);
    const DoctorNumbers& n = d.numbers;
    j["numbers"] = {
        {"requested", n.requested.count()},
        {"total_capacity", n.total_capacity.count()},
        {"free", n.free.count()},
        {"allocated", n.allocated.count()},
        {"reserved", n.reserved.count()},
        {"cached", n.cached.count()},
        {"outside_pytorch", n.outside_pytorch.count()},
        {"usable", n.usable.count()},
        {"shortfall", n.shortfall.count()},
        {"other_processes", n.other_processes.count()},
    };
    j["findings"] = d.findings;
    j["remedies"] = nlohmann::json::array();
    for (const auto& r : d.remedies) {
        nlohmann::json x = {
            {"rank", r.rank},
            {"key", r.key},
            {"title", r.title},
            {"action", r.action},
            {"saving", opt_bytes(r.saving)},
            {"basis", r.basis},
            {"addresses_verdict", r.addresses_verdict},
            {"is_fix", r.is_fix},
            {"applicable", r.applicable},
        };
        x["prediction"] = r.prediction ? prediction_to_json(*r.prediction) : nlohmann::json(nullptr);
        j["remedies"].push_back(std::move(x));
    }
    if (d.baseline) {
        const DoctorBaseline& b = *d.baseline;
        j["baseline"] = {
            {"model", b.model_name},
            {"request", request_to_json(b.request)},
            {"peak_allocated", b.peak_allocated.count()},
            {"peak_reserved", b.peak_reserved.count()},
            {"total_device", b.total_device.count()},
            {"fits_message_gpu", b.fits_message_gpu},
        };
    } else {
        j["baseline"] = nullptr;
    }
    if (d.combined)
        j["combined"] = {{"keys", d.combined->keys}, {"actions", d.combined->actions}, {"prediction", prediction_to_json(d.combined->prediction)}};
    else
        j["combined"] = nullptr;
    j["notes"] = d.notes;
    return j;
}

std::string render_doctor(const DoctorResult& d, Format f) {
    if (f == Format::Json) return doctor_to_json(d).dump(2) + "\n";
    if (f == Format::Csv) return render_table(remedies_table(d, true, true), f);
    const std::string where = gpu_label(d.oom) + ", " + wording_label(d.oom.wording);
    std::string out;
    if (f == Format::Markdown) {
        out += "### OOM diagnosis: " + std::string(to_string(d.verdict)) + "\n\n";
        out += "**" + d.headline + "**\n\n";
        out += "_" + where + "_\n\n";
        out += render_table(numbers_table(d), f) + "\n";
        out += d.explanation + "\n\n";
        if (!d.findings.empty()) {
            out += "Findings:\n\n";
            for (const auto& s : d.findings) out += "- " + s + "\n";
            out += "\n";
        }
        if (d.baseline) out += "Baseline: " + baseline_line(d) + "\n\n";
        out += "Remedies, best first:\n\n" + render_table(remedies_table(d, true, false), f);
        if (d.combined) out += "\nCombined: " + combined_line(d) + "\n";
        if (!d.notes.empty()) {
            out += "\nNotes:\n\n";
            for (const auto& s : d.notes) out += "- " + s + "\n";
        }
        return out;
    }
    out += "verdict: " + d.headline + "\n";
    out += "(" + where + ")\n\n";
    out += render_table(numbers_table(d), f) + "\n";
    out += wrap(d.explanation, 100, "");
    if (!d.findings.empty()) {
        out += "\nfindings:\n";
        for (const auto& s : d.findings) out += wrap("- " + s, 100, "  ");
    }
    if (d.baseline) out += "\nbaseline: " + baseline_line(d) + "\n";
    out += "\nremedies, best first:\n" + render_table(remedies_table(d, false, false), f);
    if (d.combined) out += wrap("combined: " + combined_line(d), 100, "");
    out += "\nwhy:\n";
    for (const auto& r : d.remedies) out += wrap(std::to_string(r.rank) + ". " + r.key + ": " + r.basis, 100, "  ");
    if (!d.notes.empty()) {
        out += "\nnotes:\n";
        for (const auto& s : d.notes) out += wrap("- " + s, 100, "  ");
    }
    return out;
}

}  // namespace gpumem
