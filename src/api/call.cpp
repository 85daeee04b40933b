// The command dispatch behind every front end (gpumem/api/api.hpp): one
// table of commands, each turning the parsed Request into a typed Answer,
// and one place that turns answers into JSON or text.
#include "gpumem/api/api.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "gpumem/core/input.hpp"

#include "gpumem/memory/estimate.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/report/advice_render.hpp"
#include "gpumem/report/calibrate_render.hpp"
#include "gpumem/report/compat_render.hpp"
#include "gpumem/report/doctor_render.hpp"
#include "gpumem/report/fit_render.hpp"
#include "gpumem/report/plan_render.hpp"
#include "gpumem/plan/serving_time.hpp"
#include "gpumem/report/serving_render.hpp"
#include "gpumem/report/snapshot_render.hpp"
#include "gpumem/report/sweep_render.hpp"
#include "gpumem/report/timeline_render.hpp"
#include "gpumem/sim/simulate.hpp"

namespace gpumem {

namespace {

using json = nlohmann::json;

sim::SnapshotOptions snapshot_options(const Request& r) {
    sim::SnapshotOptions so;
    // No rendering of a snapshot's replay (nor the doctor's) draws its
    // timeline: not recorded.
    so.replay.record_timeline = false;
    if (!r.job.alloc_conf.empty()) {
        so.replay.config = take(sim::AllocatorConfig::parse(r.job.alloc_conf));
        so.config_from_snapshot = false;
    }
    if (r.other.device) {
        if (*r.other.device > 1 << 20) fail(ErrorCode::InvalidArgument, "device", "--device: no such device index (" + std::to_string(*r.other.device) + ")");
        so.device = static_cast<int>(*r.other.device);
    }
    so.run_replay = r.other.replay;
    return so;
}

ComputeOptions compute_of(const Request& r) {
    ComputeOptions c = r.compute;
    if (r.job.params_count && r.job.seq) c.seq = r.job.seq;  // tokens per sample of a --params job
    return c;
}

// `timeline`: record the simulated timeline (the timeline command, and the
// CLI's --timeline FILE); no rendering of an estimate shows it otherwise.
FullEstimate estimate_answer(const Request& r, bool timeline) {
    SimulateOptions so;
    so.timeline = timeline;
    if (r.other.config.is_null()) return take(estimate_with_time(r.job, compute_of(r), so));
    // An uploaded Hugging Face config.json, sent inline (no file access).
    const ModelGraph g = take(load_hf_config_json(r.other.config, "uploaded config.json"));
    EstimateResult mem = take(r.job.analytic ? estimate(g, r.job) : simulate_estimate(g, r.job, so));
    ComputeResult t = take(compute_time(g, *mem.job, mem, compute_of(r)));
    return FullEstimate{std::move(mem), std::move(t)};
}

using Runner = Answer (*)(const Request&, const CallOptions&);

Answer with(Command c, const Request& r, auto&& result) {
    Answer a;
    a.command = c;
    a.request = r;
    a.result = std::forward<decltype(result)>(result);
    return a;
}

// One row per command.
const std::vector<std::pair<Command, Runner>>& commands() {
    static const std::vector<std::pair<Command, Runner>> table = {
        {Command::Estimate,
         [](const Request& r, const CallOptions&) { return with(Command::Estimate, r, estimate_answer(r, !r.other.timeline.empty())); }},
        {Command::Timeline,
         [](const Request& r, const CallOptions&) {
             FullEstimate fe = estimate_answer(r, true);
             if (!fe.memory.simulation)
                 fail(ErrorCode::InvalidArgument, "analytic", "the timeline needs the step simulation (analytic is set, or --params has no graph)");
             return with(Command::Timeline, r, std::move(fe));
         }},
        {Command::Params,
         [](const Request& r, const CallOptions&) {
             if (!r.job.params_count && r.job.model.empty())
                 fail(ErrorCode::InvalidArgument, "model", "params: name a model (preset, config.json, folder, layer-list JSON) or give --params");
             ModelGraph g = r.job.params_count ? params_only_graph(*r.job.params_count) : take(load_model(r.job.model, model_options(r.job)));
             ParamSummary s = summarize_params(g);
             return with(Command::Params, r, ParamsAnswer{std::move(g), std::move(s)});
         }},
        {Command::Serving, [](const Request& r, const CallOptions&) { return with(Command::Serving, r, take(with_serving_throughput(take(serving_memory(r.job, r.serving)), r.serving.output_len))); }},
        {Command::Fit,
         [](const Request& r, const CallOptions&) {
             if (r.serving.engine || !r.serving.command.empty()) {  // what fits a serving engine
                 ServingResult sr = take(serving_memory(r.job, r.serving));
                 sr.fit_view = true;
                 return with(Command::Fit, r, std::move(sr));
             }
             FitRequest fr;
             fr.base = r.job;
             if (r.serving.quant) fr.base.quant = take(parse_quant(*r.serving.quant));
             fr.simulate = !r.job.analytic;
             return with(Command::Fit, r, take(fit(fr)));
         }},
        {Command::Advise,
         [](const Request& r, const CallOptions&) {
             AdviceRequest ar;
             ar.base = r.job;
             ar.compute = compute_of(r);
             ar.simulate = !r.job.analytic;
             return with(Command::Advise, r, take(advise(ar)));
         }},
        {Command::Plan,
         [](const Request& r, const CallOptions&) {
             PlanRequest pr = r.plan;
             pr.base = r.job;
             pr.compute = compute_of(r);
             // --analytic: the analytic ranking alone, no confirming simulation.
             pr.confirm = r.job.analytic ? 0 : std::min<std::int64_t>(pr.top, 3);
             return with(Command::Plan, r, take(plan(pr)));
         }},
        {Command::Sweep,
         [](const Request& r, const CallOptions&) {
             SweepRequest sr = r.sweep;
             sr.base = r.job;
             if (sr.seqs.empty() && r.job.seq) sr.seqs = {*r.job.seq};
             sr.simulate = !r.job.analytic;
             return with(Command::Sweep, r, take(sweep(sr)));
         }},
        {Command::Doctor,
         [](const Request& r, const CallOptions&) {
             std::optional<EstimateRequest> run;
             if (!r.job.model.empty() || r.job.params_count) run = r.job;
             return with(Command::Doctor, r, take(diagnose(r.other.message, run)));
         }},
        {Command::Snapshot,
         [](const Request& r, const CallOptions& o) {
             const sim::SnapshotOptions so = snapshot_options(r);
             if (!r.other.data.empty()) return with(Command::Snapshot, r, take(sim::analyze_snapshot_bytes(r.other.data, "upload", so)));
             if (r.other.file.empty()) fail(ErrorCode::InvalidArgument, "file", "name the snapshot file (FILE), or send its bytes as \"data\"");
             if (!o.allow_paths) fail(ErrorCode::InvalidArgument, "path", "the service reads uploaded snapshots only: send the file's bytes");
             return with(Command::Snapshot, r, take(sim::analyze_snapshot(r.other.file, so)));
         }},
        {Command::CompatDeepSpeed,
         [](const Request& r, const CallOptions& o) {
             if (!o.allow_paths && !r.job.model.empty() && preset_config_text(r.job.model) == nullptr)
                 fail(ErrorCode::NotFound, "model", "unknown model \"" + r.job.model + "\": the service takes built-in presets only and reads no files");
             DeepSpeedOptions ds;
             ds.stage = static_cast<int>(r.other.stage);
             ds.model = r.job.model;
             if (r.job.params_count) ds.params = std::to_string(*r.job.params_count);
             if (r.other.largest_layer_params) ds.largest_layer_params = std::to_string(*r.other.largest_layer_params);
             if (r.job.parallel.gpus_per_node > 0) ds.gpus_per_node = r.job.parallel.gpus_per_node;
             if (r.job.parallel.nodes > 0) ds.nodes = r.job.parallel.nodes;
             ds.buffer_factor = r.other.buffer_factor;
             return with(Command::CompatDeepSpeed, r, take(deepspeed_estimate(ds)));
         }},
        {Command::CompatMegatron,
         [](const Request& r, const CallOptions& o) {
             if (!o.allow_paths) fail(ErrorCode::InvalidArgument, "file", "the service reads no files");
             if (r.other.file.empty()) fail(ErrorCode::InvalidArgument, "file", "name the JSON file of Megatron arguments (FILE)");
             return with(Command::CompatMegatron, r, take(megatron_report_from_file(r.other.file)));
         }},
        {Command::Calibrate,
         [](const Request& r, const CallOptions& o) {
             CalibrateRequest cr;
             cr.job = r.job;
             cr.allocated = r.other.measured_allocated;
             cr.reserved = r.other.measured_reserved;
             cr.total = r.other.measured_total;
             cr.simulate = !r.job.analytic;
             if (!r.other.file.empty() || !r.other.data.empty()) {
                 // A snapshot's replay gives the peaks the figures name.
                 if (r.other.data.empty() && !o.allow_paths) fail(ErrorCode::InvalidArgument, "snapshot", "the service reads uploaded snapshots only: send the file's bytes as \"data\"");
                 const sim::SnapshotOptions so = snapshot_options(r);
                 sim::SnapshotReport rep = take(r.other.data.empty() ? sim::analyze_snapshot(r.other.file, so) : sim::analyze_snapshot_bytes(r.other.data, "upload", so));
                 if (!rep.replay) fail(ErrorCode::InvalidArgument, "snapshot", "the snapshot could not be replayed: give --measured-allocated / --measured-reserved instead");
                 if (!cr.allocated) cr.allocated = rep.replay->peak_allocated;
                 if (!cr.reserved) cr.reserved = rep.replay->peak_reserved;
                 cr.source = "snapshot " + (r.other.data.empty() ? r.other.file : std::string("upload"));
             }
             return with(Command::Calibrate, r, take(calibrate(cr)));
         }},
        {Command::Models, [](const Request& r, const CallOptions&) { return with(Command::Models, r, ModelsAnswer{}); }},
        {Command::Gpus, [](const Request& r, const CallOptions&) { return with(Command::Gpus, r, GpusAnswer{}); }},
    };
    return table;
}

// Renders any answer: JSON (format Json) through the *_to_json functions,
// everything else through the command's renderer.
struct Renderer {
    Format f;
    const Answer& a;
    std::string operator()(const FullEstimate& e) const {
        if (a.command == Command::Timeline) return timeline_to_json(*e.memory.simulation).dump(1) + "\n";
        return render_estimate(e.memory, f, &e.time);
    }
    std::string operator()(const ParamsAnswer& p) const { return render_params(p.graph, p.summary, f); }
    std::string operator()(const FitResult& r) const { return render_fit(r, f); }
    std::string operator()(const ServingResult& r) const { return render_serving(r, f); }
    std::string operator()(const AdviceResult& r) const { return render_advice(r, f); }
    std::string operator()(const PlanResult& r) const { return render_plan(r, f); }
    std::string operator()(const SweepResult& r) const { return render_sweep(r, f); }
    std::string operator()(const DoctorResult& r) const { return render_doctor(r, f); }
    std::string operator()(const sim::SnapshotReport& r) const { return render_snapshot(r.summary, r.replay ? &*r.replay : nullptr, f); }
    std::string operator()(const DeepSpeedEstimate& r) const { return render_deepspeed(r, f); }
    std::string operator()(const MegatronMemoryReport& r) const { return render_megatron(r, f); }
    std::string operator()(const ModelsAnswer&) const { return render_models(presets(), f); }
    std::string operator()(const GpusAnswer&) const { return render_gpus(gpu_catalog(), f); }
    std::string operator()(const CalibrateResult& r) const { return render_calibrate(r, f); }
};

struct JsonMaker {
    const Answer& a;
    json operator()(const FullEstimate& e) const {
        if (a.command == Command::Timeline) return timeline_to_json(*e.memory.simulation);
        return estimate_to_json(e.memory, &e.time);
    }
    json operator()(const ParamsAnswer& p) const { return params_to_json(p.graph, p.summary); }
    json operator()(const FitResult& r) const { return fit_to_json(r); }
    json operator()(const ServingResult& r) const { return serving_to_json(r); }
    json operator()(const AdviceResult& r) const { return advice_to_json(r); }
    json operator()(const PlanResult& r) const { return plan_to_json(r); }
    json operator()(const SweepResult& r) const { return sweep_to_json(r); }
    json operator()(const DoctorResult& r) const { return doctor_to_json(r); }
    json operator()(const sim::SnapshotReport& r) const { return snapshot_to_json(r.summary, r.replay ? &*r.replay : nullptr); }
    json operator()(const DeepSpeedEstimate& r) const { return deepspeed_rows_to_json(r); }
    json operator()(const MegatronMemoryReport& r) const { return megatron_to_json(r); }
    json operator()(const ModelsAnswer&) const { return models_to_json(presets()); }
    json operator()(const GpusAnswer&) const { return gpus_to_json(gpu_catalog()); }
    json operator()(const CalibrateResult& r) const { return calibrate_to_json(r); }
};

// --calibration: a file (CLI, Python) or the document inline (JSON requests),
// parsed once into the job that every estimate of the command reads.
Request with_calibration(const Request& r, const CallOptions& o) {
    Request out = r;
    const json& c = r.other.calibration;
    if (c.is_null()) return out;
    if (c.is_object()) {
        out.job.calibration = std::make_shared<const Calibration>(take(calibration_from_json(c)));
    } else {
        if (!o.allow_paths) fail(ErrorCode::InvalidArgument, "calibration", "the service reads no files: send the calibration document itself as \"calibration\"");
        out.job.calibration = std::make_shared<const Calibration>(take(load_calibration(c.get<std::string>())));
    }
    return out;
}

// An overflow of checked arithmetic that reached the front end without a
// field (capture()'s "size overflows 64 bits: ..."): name the request's
// size-driving inputs (the fields with a documented limit that the request
// sets), the largest relative to its limit first, and say which to reduce.
Error with_overflow_fields(Error e, Command c, const Request& r) {
    if (e.code != ErrorCode::Overflow || !e.field.empty()) return e;
    std::vector<std::pair<double, const Field*>> given;
    for (const Field* f : fields_of(c)) {
        if (f->limit.empty() || !f->max || f->cli_only) continue;
        const json v = f->get(r);
        if (v.is_null() || v == f->default_value) continue;
        double x = 0;
        if (v.is_number()) x = v.get<double>();
        else if (v.is_array())
            for (const auto& y : v)
                if (y.is_number()) x = std::max(x, y.get<double>());
        if (x <= 1) continue;
        given.emplace_back(std::log(x) / std::log(std::max(*f->max, 2.0)), f);
    }
    std::stable_sort(given.begin(), given.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    if (given.size() > 4) given.resize(4);
    const std::string what = e.message.rfind("size overflows 64 bits: ", 0) == 0 ? e.message.substr(24) : e.message;
    const std::string model = !r.job.model.empty() ? r.job.model : r.job.params_count ? std::to_string(*r.job.params_count) + " parameters" : "";
    std::string msg = "the job is too large to represent: a byte or element count overflows 64 bits (" + what + ")";
    if (!model.empty()) msg += " for " + model;
    if (given.empty()) {
        msg += "; the model's own sizes are too large at these settings: check its config (hidden_size, vocab_size, num_hidden_layers)";
        e.field = "model";
    } else {
        std::string with, reduce;
        for (std::size_t i = 0; i < given.size(); ++i) {
            const Field* f = given[i].second;
            const json v = f->get(r);
            with += (i ? ", " : "") + f->flag() + " " + v.dump();
            if (i < 2) reduce += (i ? " or " : "") + f->flag();
        }
        msg += " with " + with + "; reduce " + reduce;
        e.field = given.front().second->name;
    }
    e.message = msg;
    return e;
}

}  // namespace

Result<Answer> run(Command c, const Request& r_in, const CallOptions& o) {
    auto a = guarded([&]() -> Answer {
        Request r = with_calibration(r_in, o);
        if (!o.allow_paths) r.job.files = false;  // MODEL: built-in presets only, no file or folder is looked at
        for (const auto& [cmd, runner] : commands())
            if (cmd == c) return runner(r, o);
        fail(ErrorCode::NotFound, "command", std::string("unknown command \"") + to_string(c) + "\"");
    });
    if (!a) return with_overflow_fields(a.error(), c, r_in);
    return a;
}

Result<Answer> run(Command c, const json& body, const CallOptions& o) {
    // Before any copy or recursive walk of the value (nlohmann's copy, dump
    // and comparison recurse: a value nested 100,000 deep overflows the stack).
    if (auto d = guarded([&] {
            check_json_depth(body, "request");
            return true;
        });
        !d)
        return d.error();
    auto r = parse_request(c, body);
    if (!r) return r.error();
    return run(c, r.value(), o);
}

namespace {
// "model" and "gpu" have one shape in every answer: {"name", ...} objects
// (estimate and params add "family" and "source"; "gpu" carries "memory").
void same_shapes(json& j, const Answer& a) {
    const EstimateRequest& job = a.request.job;
    const bool has_job = find_field("gpu")->in(a.command);
    if (j.contains("model") && j["model"].is_string()) j["model"] = json{{"name", j["model"]}};
    if (has_job && !j.contains("model") && (!job.model.empty() || job.params_count))
        j["model"] = json{{"name", job.params_count ? std::to_string(*job.params_count) + " parameters" : job.model}};
    if (has_job && (!j.contains("gpu") || j["gpu"].is_string())) {
        if (auto g = find_gpu(job.gpu)) {
            const Bytes memory = job.gpu_memory.value_or(g.value().memory);
            j["gpu"] = json{{"name", g.value().name}, {"memory", memory.count()}};
        } else if (j.contains("gpu")) {
            j["gpu"] = json{{"name", j["gpu"]}};
        }
    }
}
}  // namespace

json answer_json(const Answer& a) {
    json j = std::visit(JsonMaker{a}, a.result);
    if (!j.is_object()) return j;
    if (a.command != Command::Timeline) same_shapes(j, a);
    j["schema_version"] = kSchemaVersion;
    return j;
}

std::string render(const Answer& a, Format f) {
    if (f == Format::Json) {
        if (a.command == Command::Timeline) return answer_json(a).dump(1) + "\n";
        return answer_json(a).dump(2) + "\n";
    }
    return std::visit(Renderer{f, a}, a.result);
}

Result<json> api_call(std::string_view command, const json& body, bool allow_paths) {
    return guarded([&]() -> json {
        check_json_depth(body, "request");
        const Command c = take(parse_command(command));
        CallOptions o;
        o.allow_paths = allow_paths;
        return answer_json(take(run(c, body, o)));
    });
}

Result<json> api_snapshot_bytes(std::string_view data, const json& options) {
    return guarded([&]() -> json {
        check_json_depth(options, "request");
        if (!options.is_object()) fail(ErrorCode::InvalidArgument, "", "snapshot options must be a JSON object");
        Request r = take(parse_request(Command::Snapshot, options));
        r.other.data = std::string(data);
        return answer_json(take(run(Command::Snapshot, r)));
    });
}

void check_json_depth(const json& value, std::string_view origin, int max_depth) {
    // Iterative: an explicit stack of (value, depth), no recursion.
    std::vector<std::pair<const json*, int>> stack{{&value, 1}};
    while (!stack.empty()) {
        const auto [v, depth] = stack.back();
        stack.pop_back();
        if (!v->is_structured()) continue;
        if (depth > max_depth)
            fail(ErrorCode::ParseError, std::string(origin),
                 std::string(origin) + ": JSON nested deeper than " + std::to_string(max_depth) +
                     " levels; no gpumem input nests that deep, check the request");
        for (const auto& child : *v)
            if (child.is_structured()) stack.emplace_back(&child, depth + 1);
    }
}

const std::vector<std::string>& api_commands() {
    static const std::vector<std::string> c = [] {
        std::vector<std::string> v;
        for (Command cmd : all_commands()) v.emplace_back(to_string(cmd));
        std::sort(v.begin(), v.end());
        return v;
    }();
    return c;
}

}  // namespace gpumem
