#include "gpumem/report/render.hpp"

#include <cmath>
#include <cstdio>
#include <optional>
#include <string_view>

#include <algorithm>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gpumem {

Result<Format> parse_format(std::string_view s) {
    if (s == "text" || s == "table") return Format::Text;
    if (s == "json") return Format::Json;
    if (s == "csv") return Format::Csv;
    if (s == "markdown" || s == "md") return Format::Markdown;
    return Error{ErrorCode::InvalidArgument, "--format: unknown value \"" + std::string(s) + "\"; use one of text|json|csv|markdown", "format"};
}

namespace {
std::string csv_cell(const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string o = "\"";
    for (char c : s) {
        if (c == '"') o += "\"\"";
        else o += c;
    }
    return o + "\"";
}
std::string md_cell(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '|') o += "\\|";
        else o += c;
    }
    return o;
}
std::string with_commas(std::int64_t v) {
    std::string s = std::to_string(v < 0 ? -v : v), o;
    int n = 0;
    for (auto it = s.rbegin(); it != s.rend(); ++it) {
        if (n && n % 3 == 0) o.push_back(',');
        o.push_back(*it);
        ++n;
    }
    if (v < 0) o.push_back('-');
    std::reverse(o.begin(), o.end());
    return o;
}
std::string human_count(std::int64_t v) {
    const double d = static_cast<double>(v);
    if (d >= 1e12) return fmt::format("{:.2f}T", d / 1e12);
    if (d >= 1e9) return fmt::format("{:.2f}B", d / 1e9);
    if (d >= 1e6) return fmt::format("{:.2f}M", d / 1e6);
    if (d >= 1e3) return fmt::format("{:.2f}K", d / 1e3);
    return std::to_string(v);
}
}  // namespace

namespace {
// A cell written for people as a plain number and its unit: "7.06 GiB" ->
// (7580467036.16, "bytes"), "-54%" -> (-54, "%"), "0.009 s" -> (0.009, "s"),
// "39,383,808" -> (39383808, ""); nullopt for anything else.
std::optional<std::pair<std::string, std::string>> plain_number(const std::string& cell) {
    std::string s;
    for (char c : cell)
        if (c != ',') s.push_back(c);
    if (s.empty()) return std::nullopt;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || !std::isfinite(v)) return std::nullopt;
    std::string unit(end);
    while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
    static const std::pair<const char*, double> kSizes[] = {{"B", 1.0}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    for (const auto& [u, mult] : kSizes)
        if (unit == u) return std::pair{std::to_string(std::llround(v * mult)), std::string("bytes")};
    if (unit.empty()) return std::pair{s, unit};  // already a number: keep its digits
    if (unit == "%" || unit == "s" || unit == "ms" || unit == "us" || unit == "x") {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.15g", v);
        return std::pair{std::string(buf), unit};
    }
    return std::nullopt;
}
}  // namespace

std::string render_table(const Table& t, Format f) {
    std::string out;
    if (f == Format::Csv) {
        // Scripts read plain numbers: a column whose every cell is a number
        // with one unit is written as numbers, the unit in its header.
        std::vector<std::string> header = t.header;
        std::vector<std::vector<std::string>> rows = t.rows;
        for (std::size_t i = 0; i < header.size(); ++i) {
            std::optional<std::string> unit;
            bool numeric = true, any = false;
            for (const auto& r : t.rows) {
                if (i >= r.size() || r[i].empty() || r[i] == "-") continue;
                const auto n = plain_number(r[i]);
                if (!n || (unit && *unit != n->second)) {
                    numeric = false;
                    break;
                }
                unit = n->second;
                any = true;
            }
            if (!numeric || !any) continue;
            for (auto& r : rows)
                if (i < r.size() && !r[i].empty() && r[i] != "-") r[i] = plain_number(r[i])->first;
                else if (i < r.size()) r[i].clear();
            if (!unit->empty() && header[i].find('(') == std::string::npos)
                header[i] += " (" + *unit + ")";
        }
        for (std::size_t i = 0; i < header.size(); ++i) out += (i ? "," : "") + csv_cell(header[i]);
        out += "\n";
        for (const auto& r : rows) {
            for (std::size_t i = 0; i < r.size(); ++i) out += (i ? "," : "") + csv_cell(r[i]);
            out += "\n";
        }
        return out;
    }
    if (f == Format::Markdown) {
        out += "|";
        for (const auto& h : t.header) out += " " + md_cell(h) + " |";
        out += "\n|";
        for (std::size_t i = 0; i < t.header.size(); ++i)
            out += (i < t.right_align.size() && t.right_align[i]) ? "---:|" : "---|";
        out += "\n";
        for (const auto& r : t.rows) {
            out += "|";
            for (const auto& c : r) out += " " + md_cell(c) + " |";
            out += "\n";
        }
        return out;
    }
    std::vector<std::size_t> w(t.header.size(), 0);
    for (std::size_t i = 0; i < t.header.size(); ++i) w[i] = t.header[i].size();
    for (const auto& r : t.rows)
        for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
    auto line = [&](const std::vector<std::string>& r) {
        std::string s;
        for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) {
            const bool right = i < t.right_align.size() && t.right_align[i];
            const std::size_t pad = w[i] - r[i].size();
            if (i) s += "  ";
            if (right) s += std::string(pad, ' ') + r[i];
            else s += r[i] + (i + 1 < r.size() ? std::string(pad, ' ') : "");
        }
        return s + "\n";
    };
    out += line(t.header);
    std::size_t total = 0;
    for (auto x : w) total += x + 2;
    out += std::string(total > 2 ? total - 2 : 0, '-') + "\n";
    for (const auto& r : t.rows) out += line(r);
    return out;
}

nlohmann::json error_to_json(const Error& e) {
    return {{"error", {{"code", to_string(e.code)}, {"message", e.message}, {"field", e.field}}}};
}

nlohmann::json params_to_json(const ModelGraph& g, const ParamSummary& s) {
    nlohmann::json j;
    j["model"] = {{"name", g.name}, {"family", g.family}, {"source", g.source}};
    j["params"]["total"] = s.total;
    j["params"]["trainable"] = s.trainable;
    j["params"]["by_component"] = nlohmann::json::object();
    for (const auto& [k, v] : s.by_component) j["params"]["by_component"][k] = v;
    j["params"]["by_dtype"] = nlohmann::json::object();
    for (const auto& [k, v] : s.by_dtype) j["params"]["by_dtype"][k] = v;
    j["notes"] = g.notes;
    return j;
}

namespace {
// A JSON object built by emplacing each member into its map: nlohmann's
// initializer lists ({{"key", value}, ...}) first make every pair a
// two-element array and then copy it into the object, which was most of
// writing an estimate's answer (an analytic gpumem.estimate() spent longer
// on it than on the estimate). The members' order is the map's (sorted), as
// before.
// (The builder is used up: a named one is passed on with std::move.)
class Obj {
public:
    Obj& operator()(std::string_view key, nlohmann::json value) & {
        m_.emplace(std::string(key), std::move(value));
        return *this;
    }
    Obj&& operator()(std::string_view key, nlohmann::json value) && { return std::move((*this)(key, std::move(value))); }
    operator nlohmann::json() && { return nlohmann::json(std::move(m_)); }

private:
    nlohmann::json::object_t m_;
};
}  // namespace

nlohmann::json estimate_to_json(const EstimateResult& r, const ComputeResult* time) {
    Obj j;
    j("model", Obj()("name", r.model_name)("family", r.family)("source", r.model_source));
    {
        Obj by_component;
        for (const auto& [k, v] : r.params.by_component) by_component(k, v);
        j("params", Obj()("total", r.params.total)("trainable", r.trainable_params())("by_component", std::move(by_component)));
    }
    j("request", request_to_json(r.request()));
    const PerGpu& p = r.per_gpu;
    j("per_gpu", Obj()("weights", p.weights.count())
                     ("gradients", p.gradients.count())
                     ("optimizer_states", p.optimizer_states.count())
                     ("paged_optimizer_states", p.paged_optimizer_states.count())
                     ("master_weights", p.master_weights.count())
                     ("activations", p.activations.count())
                     ("kv_cache", p.kv_cache.count())
                     ("transient", p.transient.count())
                     ("cublas_workspace", p.cublas_workspace.count())
                     ("peak_allocated", p.peak_allocated.count())
                     ("allocator_overhead", p.allocator_overhead.count())
                     ("peak_reserved", p.peak_reserved.count())
                     ("cuda_context", p.cuda_context.count())
                     ("total_device", p.total_device.count())
                     ("load_peak", p.load_peak.count())
                     ("capacity", p.capacity.count())
                     ("fits", p.fits)
                     ("peak_phase", p.peak_phase));
    {
        nlohmann::json rows = nlohmann::json::array();
        rows.get_ref<nlohmann::json::array_t&>().reserve(r.breakdown.size());
        for (const auto& row : r.breakdown) rows.push_back(Obj()("key", row.key)("label", row.label)("bytes", row.bytes.count())("detail", row.detail));
        j("breakdown", std::move(rows));
    }
    {
        const Uncertainty& u = r.uncertainty;
        auto range = [](const Range& x) -> nlohmann::json { return Obj()("low", x.low.count())("expected", x.expected.count())("high", x.high.count()); };
        j("uncertainty", Obj()("range", range(u.total))("reserved", range(u.reserved))("allocated", range(u.allocated))("verdict", u.verdict)("path", u.path)
                              ("rows", u.rows)("ratio_low", u.ratio_low)("ratio_high", u.ratio_high)("calibrated", u.calibrated)("basis", u.basis));
    }
    {
        nlohmann::json blocks = nlohmann::json::array();
        for (const auto& b : r.activation_detail.blocks) blocks.push_back(Obj()("block", b.block)("repeat", b.repeat)("per_instance", b.per_instance.count()));
        j("activations_by_block", std::move(blocks));
    }
    j("gpu", Obj()("name", r.gpu().name)("memory", r.gpu().memory.count()));
    j("seq", r.seq());
    if (r.parallel) {
        const ParallelResult& par = *r.parallel;
        Obj pj;
        pj("dp", par.layout.dp);
        pj("gpus_per_node", par.layout.gpus_per_node);
        pj("most_loaded_stage", par.most_loaded);
        pj("nccl_outside_allocator", par.nccl_outside.count());
        pj("cpu_per_node", par.cpu_per_node.count());
        pj("nvme_per_node", par.nvme_per_node.count());
        pj("comm_bytes_per_step", Obj()("tp", par.comm.tp_per_step.count())("dp", par.comm.dp_per_step.count())("pp", par.comm.pp_per_step.count())
                                       ("cp", par.comm.cp_per_step.count())("ep", par.comm.ep_per_step.count()));
        nlohmann::json stages = nlohmann::json::array();
        for (const auto& st : par.stages) {
            Obj sj;
            sj("stage", st.stage)("contents", st.contents)("layers", st.layers)("params", st.params)("weights", st.weights.count())
              ("gradients", st.gradients.count())("optimizer_states", st.optimizer_states.count())("activations", st.activations.count())
              ("in_flight", st.in_flight)("gathered_params", st.gathered_params.count())("comm_buffers", st.comm_buffers.count())
              ("transient", st.transient.count())("peak_phase", st.peak_phase)
              // The analytic peak of torch.cuda.max_memory_allocated() on this rank (cuBLAS workspaces included).
              ("allocated", (st.allocated + r.per_gpu.cublas_workspace).count());
            if (st.simulated) {
                sj("simulated_peak_allocated", st.simulated_peak_allocated.count());
                sj("simulated_peak_reserved", st.simulated_peak_reserved.count());
            }
            stages.push_back(std::move(sj));
        }
        pj("stages", std::move(stages));
        pj("pp_layers", par.layout.stage_layers);
        pj("vpp", par.layout.vpp);
        j("parallel", std::move(pj));
    }
    if (r.simulation) {
        const SimulationSummary& s = *r.simulation;
        Obj sj;
        sj("allocator", s.allocator);
        sj("alloc_conf", s.alloc_conf);
        sj("events", s.events);
        sj("peak_phase", s.peak_phase);
        sj("peak_step", s.peak_step + 1);
        sj("first_step", Obj()("peak_allocated", s.first_step_peak_allocated.count())("peak_reserved", s.first_step_peak_reserved.count()));
        sj("steady_state", Obj()("peak_allocated", s.steady_peak_allocated.count())("peak_reserved", s.steady_peak_reserved.count()));
        sj("fragmentation_at_peak", s.fragmentation_at_peak.count());
        sj("largest_free_block_at_peak", s.largest_free_block_at_peak.count());
        sj("live_after", Obj()("forward", s.after_forward.count())("backward", s.after_backward.count())("optimizer", s.after_optimizer.count())
                             ("zero_grad", s.after_zero_grad.count()));
        nlohmann::json phases = nlohmann::json::array();
        for (const auto& ph : s.phases)
            phases.push_back(Obj()("phase", ph.phase)("step", ph.step + 1)("peak_allocated", ph.peak_allocated.count())("peak_reserved", ph.peak_reserved.count()));
        sj("phases", std::move(phases));
        nlohmann::json top = nlohmann::json::array();
        for (const auto& t : s.top_at_peak) top.push_back(Obj()("bytes", t.size.count())("label", t.label)("phase", t.phase));
        sj("top_at_peak", std::move(top));
        sj("oom", s.oom);
        if (s.oom) sj("oom_detail", s.oom_detail);
        sj("notes", s.notes);
        j("simulation", std::move(sj));
    }
    nlohmann::json assumptions = r.assumptions;
    if (time) {
        const ComputeResult& t = *time;
        j("flops", Obj()("per_step", t.flops_per_step)("per_token", t.flops_per_token)("model_per_step", t.model_flops_per_step));
        Obj tj;
        tj("step_seconds", t.step_seconds)("compute_seconds", t.compute_seconds)("comm_seconds", t.comm_seconds)("comm_total_seconds", t.comm_total_seconds)
          ("bubble_seconds", t.bubble_seconds)("tokens_per_step", t.tokens_per_step)("tokens_per_second", t.tokens_per_second)("peak_tflops", t.peak_tflops)
          ("tflops_per_gpu", t.step_seconds > 0 && r.gpu().name.size() ? t.model_flops_per_step / t.step_seconds /
                                                                         static_cast<double>(std::max<std::int64_t>(1, r.request().parallel.gpus)) / 1e12
                                                                   : 0.0)
          ("mfu", t.mfu)("mfu_source", t.mfu_source)("gemm_efficiency", t.gemm_efficiency)("attention_efficiency", t.attention_efficiency)
          ("efficiency_source", t.efficiency_source);
        if (r.request().mode != Mode::Infer) {
            const TimeBreakdown& b = t.breakdown;
            tj("breakdown", Obj()("compute", b.compute)("tp", b.tp)("cp", b.cp)("ep", b.ep)("pp", b.pp)("bubble", b.bubble)("dp", b.dp)("optimizer", b.optimizer)
                                 ("offload", b.offload));
        }
        if (t.total_seconds) tj("total_seconds", *t.total_seconds);
        if (t.gpu_hours) tj("gpu_hours", *t.gpu_hours);
        if (t.cost) tj("cost", *t.cost);
        if (r.request().mode == Mode::Infer) {
            tj("prefill_seconds", t.prefill_seconds);
            tj("decode_tokens_per_second", t.decode_tokens_per_second);
            tj("decode_seconds_per_token", t.decode_seconds_per_token);
        }
        j("time", std::move(tj));
        for (const auto& a : t.assumptions) assumptions.push_back(a);
    }
    j("assumptions", std::move(assumptions));
    j("warnings", r.warnings);
    return j;
}

std::string render_estimate(const EstimateResult& r, Format f, const ComputeResult* time) {
    if (f == Format::Json) return estimate_to_json(r, time).dump(2) + "\n";
    Table t;
    t.header = {"part", "bytes", "size", "detail"};
    t.right_align = {false, true, true, false};
    for (const auto& row : r.breakdown)
        t.rows.push_back({row.key, std::to_string(row.bytes.count()), format_bytes(row.bytes), row.detail});
    const PerGpu& p = r.per_gpu;
    t.rows.push_back({"peak_allocated", std::to_string(p.peak_allocated.count()), format_bytes(p.peak_allocated), "torch.cuda.max_memory_allocated()"});
    t.rows.push_back({"peak_reserved", std::to_string(p.peak_reserved.count()), format_bytes(p.peak_reserved), "torch.cuda.max_memory_reserved()"});
    t.rows.push_back({"total_device", std::to_string(p.total_device.count()), format_bytes(p.total_device), "nvidia-smi"});
    if (f == Format::Csv) {
        // bytes only (the size column repeats them for people), and the verdict
        Table c;
        c.header = {"part", "bytes", "detail"};
        for (const auto& row : t.rows) c.rows.push_back({row[0], row[1], row[3]});
        c.rows.push_back({"capacity", std::to_string(p.capacity.count()), r.gpu().name});
        c.rows.push_back({"fits", p.fits ? "1" : "0", p.fits ? "fits" : "does not fit"});
        c.rows.push_back({"total_device_low", std::to_string(r.uncertainty.total.low.count()), r.uncertainty.verdict});
        c.rows.push_back({"total_device_high", std::to_string(r.uncertainty.total.high.count()), r.uncertainty.basis});
        return render_table(c, f);
    }
    std::string out;
    const std::string head = fmt::format("{} ({}, {} params, {} trainable) - {} on {}", r.model_name, r.family,
                                         human_count(r.params.total), human_count(r.trainable_params()),
                                         to_string(r.request().mode), r.gpu().name);
    const std::string verdict = fmt::format("{}: {} of {} ({:.1f}%), peak in {}", p.fits ? "FITS" : "DOES NOT FIT",
                                            format_bytes(p.total_device), format_bytes(p.capacity),
                                            100.0 * static_cast<double>(p.total_device.count()) / static_cast<double>(std::max<std::int64_t>(1, p.capacity.count())),
                                            p.peak_phase);
    const Uncertainty& u = r.uncertainty;
    const std::string range = fmt::format("peak {} (range {} - {}): {}; {}", format_bytes(u.total.expected), format_bytes(u.total.low),
                                          format_bytes(u.total.high), u.verdict, u.basis);
    if (f == Format::Markdown) {
        out += "### " + head + "\n\n**" + verdict + "**\n\n" + range + "\n\n" + render_table(t, f) + "\n";
        out += "Assumptions:\n\n";
        for (const auto& a : r.assumptions) out += "- " + a + "\n";
        for (const auto& w : r.warnings) out += "- **warning:** " + w + "\n";
        return out;
    }
    out += head + "\n" + verdict + "\n" + range + "\n\n" + render_table(t, f);
    if (r.parallel) {
        const ParallelResult& par = *r.parallel;
        Table st;
        const bool any_sim = std::any_of(par.stages.begin(), par.stages.end(), [](const StageMemory& s) { return s.simulated; });
        st.header = {"stage", "holds", "params/GPU", "weights", "grads", "optimizer", "activations", "buffers", "peak allocated"};
        if (any_sim) {
            st.header.push_back("simulated allocated");
            st.header.push_back("simulated reserved");
        }
        st.right_align.assign(st.header.size(), true);
        st.right_align[1] = false;
        for (const auto& s : par.stages) {
            std::vector<std::string> row = {std::to_string(s.stage), s.contents, human_count(s.params), format_bytes(s.weights), format_bytes(s.gradients),
                                            format_bytes(s.optimizer_states), format_bytes(s.activations), format_bytes(s.gathered_params + s.comm_buffers),
                                            format_bytes(s.allocated + r.per_gpu.cublas_workspace)};
            if (any_sim) {
                row.push_back(s.simulated ? format_bytes(s.simulated_peak_allocated) : "-");
                row.push_back(s.simulated ? format_bytes(s.simulated_peak_reserved) : "-");
            }
            st.rows.push_back(std::move(row));
        }
        out += "\nper pipeline stage (one GPU of each; the most loaded is stage " + std::to_string(par.most_loaded) +
               (any_sim ? "; simulated: every stage within 15% of the largest analytic peak" : "") + "):\n" + render_table(st, f);
        if (par.cpu_per_node > Bytes(0) || par.nvme_per_node > Bytes(0))
            out += "offload per node: CPU " + format_bytes(par.cpu_per_node) + ", NVMe " + format_bytes(par.nvme_per_node) + "\n";
        out += "communication per step and GPU: tp " + format_bytes(par.comm.tp_per_step) + ", dp " + format_bytes(par.comm.dp_per_step) +
               ", pp " + format_bytes(par.comm.pp_per_step) + ", cp " + format_bytes(par.comm.cp_per_step) + ", ep " +
               format_bytes(par.comm.ep_per_step) + "\n";
    }
    if (r.simulation) {
        const SimulationSummary& s = *r.simulation;
        Table ph;
        ph.header = {"step", "phase", "peak allocated", "peak reserved"};
        ph.right_align = {true, false, true, true};
        // One row per phase of each step (the micro-batches' forwards and
        // backwards merged: their largest peaks and how many there were).
        struct Row {
            std::int32_t step;
            std::string phase;
            Bytes alloc, reserved;
            int count;
        };
        std::vector<Row> rows;
        for (const auto& x : s.phases) {
            auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& row) { return row.step == x.step && row.phase == x.phase; });
            if (it == rows.end()) rows.push_back({x.step, x.phase, x.peak_allocated, x.peak_reserved, 1});
            else {
                it->alloc = max(it->alloc, x.peak_allocated);
                it->reserved = max(it->reserved, x.peak_reserved);
                ++it->count;
            }
        }
        for (const auto& x : rows)
            ph.rows.push_back({std::to_string(x.step + 1), x.count > 1 ? x.phase + " (" + std::to_string(x.count) + " runs)" : x.phase,
                               format_bytes(x.alloc), format_bytes(x.reserved)});
        out += "\nsimulated step (" + s.allocator + " allocator, " + std::to_string(s.events) + " events): first step peak " +
               format_bytes(s.first_step_peak_allocated) + " allocated / " + format_bytes(s.first_step_peak_reserved) +
               " reserved; steady state " + format_bytes(s.steady_peak_allocated) + " / " + format_bytes(s.steady_peak_reserved) + "\n\n" +
               render_table(ph, f);
        if (!s.top_at_peak.empty()) {
            Table tt;
            tt.header = {"largest tensors alive at the peak", "size", "allocated in"};
            tt.right_align = {false, true, false};
            for (const auto& x : s.top_at_peak) tt.rows.push_back({x.label, format_bytes(x.size), x.phase});
            out += "\n" + render_table(tt, f);
        }
        out += "fragmentation at the peak: " + format_bytes(s.fragmentation_at_peak) + " reserved but unallocated, largest free block " +
               format_bytes(s.largest_free_block_at_peak) + "\n";
    }
    if (time) {
        const ComputeResult& ct = *time;
        if (r.request().mode == Mode::Infer)
            out += fmt::format("\ntime: prefill {:.3f} s, decode {:.1f} tokens/s per sequence ({:.2f} ms per token)\n", ct.prefill_seconds,
                               ct.decode_tokens_per_second, 1e3 * ct.decode_seconds_per_token);
        else {
            const double gpus = static_cast<double>(std::max<std::int64_t>(1, r.request().parallel.gpus));
            out += fmt::format("\ntime: {:.3g} FLOPs per step, {:.3f} s per step, {:.0f} tokens/s, {:.0f} model TFLOP/s per GPU (MFU {:.2f}, {})",
                               ct.flops_per_step, ct.step_seconds, ct.tokens_per_second,
                               ct.step_seconds > 0 ? ct.model_flops_per_step / ct.step_seconds / gpus / 1e12 : 0.0, ct.mfu, ct.mfu_source);
            if (ct.total_seconds) out += fmt::format("; {:.2f} days, {:.0f} GPU-hours", *ct.total_seconds / 86400.0, ct.gpu_hours.value_or(0));
            if (ct.cost) out += fmt::format(", cost {:.0f}", *ct.cost);
            out += "\n";
            const TimeBreakdown& b = ct.breakdown;
            const std::pair<const char*, double> parts[] = {{"compute", b.compute}, {"bubble", b.bubble}, {"tp", b.tp},   {"cp", b.cp}, {"ep", b.ep},
                                                            {"pp", b.pp},           {"dp", b.dp},         {"optimizer", b.optimizer}, {"offload", b.offload}};
            std::string line;
            for (const auto& [name, v] : parts)
                if (v > 0 && ct.step_seconds > 0)
                    line += fmt::format("{}{} {:.3g} s ({:.0f}%)", line.empty() ? "" : ", ", name, v, 100.0 * v / ct.step_seconds);
            if (!line.empty()) out += "  step parts (slowest rank; communication as exposed): " + line + "\n";
        }
    }
    out += "\nassumptions:\n";
    if (time)
        for (const auto& a : time->assumptions) out += "  - " + a + "\n";
    for (const auto& a : r.assumptions) out += "  - " + a + "\n";
    for (const auto& w : r.warnings) out += "warning: " + w + "\n";
    return out;
}

std::string render_params(const ModelGraph& g, const ParamSummary& s, Format f) {
    if (f == Format::Json) return params_to_json(g, s).dump(2) + "\n";
    Table t;
    t.header = {"group", "name", "params", "share"};
    t.right_align = {false, false, true, true};
    const double tot = static_cast<double>(std::max<std::int64_t>(1, s.total));
    for (const auto& [k, v] : s.by_component)
        t.rows.push_back({"component", k, with_commas(v), fmt::format("{:.2f}%", 100.0 * static_cast<double>(v) / tot)});
    for (const auto& [k, v] : s.by_dtype)
        t.rows.push_back({"dtype", k, with_commas(v), fmt::format("{:.2f}%", 100.0 * static_cast<double>(v) / tot)});
    t.rows.push_back({"total", "total", with_commas(s.total), "100.00%"});
    t.rows.push_back({"total", "trainable", with_commas(s.trainable), fmt::format("{:.2f}%", 100.0 * static_cast<double>(s.trainable) / tot)});
    if (f == Format::Csv) return render_table(t, f);
    std::string head = fmt::format("{} ({}, from {}): {} parameters ({})", g.name, g.family, g.source, with_commas(s.total), human_count(s.total));
    if (f == Format::Markdown) return "### " + head + "\n\n" + render_table(t, f);
    return head + "\n\n" + render_table(t, f);
}

nlohmann::json models_to_json(const std::vector<PresetInfo>& p) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& m : p) j.push_back({{"name", m.name}, {"model_type", m.model_type}, {"hf_id", m.hf_id}, {"source", m.source}});
    return {{"models", j}};
}

std::string render_models(const std::vector<PresetInfo>& p, Format f) {
    if (f == Format::Json) return models_to_json(p).dump(2) + "\n";
    Table t;
    const bool sources = f == Format::Csv || f == Format::Markdown;  // too wide for the terminal table
    t.header = {"name", "model_type", "hugging face id"};
    if (sources) t.header.push_back("config source");
    for (const auto& m : p) {
        t.rows.push_back({m.name, m.model_type, m.hf_id});
        if (sources) t.rows.back().push_back(m.source);
    }
    std::string out = render_table(t, f);
    if (!sources) out += "\nwhere each config.json came from: gpumem models --format json (or csv, markdown)\n";
    return out;
}

nlohmann::json gpus_to_json(const std::vector<GpuSpec>& gs) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& g : gs)
        j.push_back({{"name", g.name}, {"vendor", g.vendor}, {"arch", g.arch}, {"memory", g.memory.count()},
                     {"bandwidth_gbs", g.bandwidth_gbs}, {"tflops", {{"fp32", g.tflops_fp32}, {"tf32", g.tflops_tf32}, {"fp16", g.tflops_fp16}, {"bf16", g.tflops_bf16}, {"fp8", g.tflops_fp8}, {"int8", g.tflops_int8}}},
                     {"cuda_context", g.cuda_context.count()}, {"cuda_context_eager_loading", g.cuda_context_eager.count()},
                     {"cublas_workspace", g.cublas_workspace.count()}});
    return {{"gpus", j}};
}

std::string render_gpus(const std::vector<GpuSpec>& gs, Format f) {
    if (f == Format::Json) return gpus_to_json(gs).dump(2) + "\n";
    Table t;
    t.header = {"name", "memory", "bandwidth GB/s", "fp32", "tf32", "fp16", "bf16", "fp8", "int8"};
    t.right_align = {false, true, true, true, true, true, true, true, true};
    auto tf = [](double v) { return v > 0 ? fmt::format("{:g}", v) : std::string("-"); };
    for (const auto& g : gs)
        t.rows.push_back({g.name, format_bytes(g.memory), fmt::format("{:g}", g.bandwidth_gbs), tf(g.tflops_fp32), tf(g.tflops_tf32),
                          tf(g.tflops_fp16), tf(g.tflops_bf16), tf(g.tflops_fp8), tf(g.tflops_int8)});
    std::string out = render_table(t, f);
    if (f == Format::Text) out += "peak dense TFLOP/s per dtype (vendor datasheets)\n";
    return out;
}

}  // namespace gpumem
