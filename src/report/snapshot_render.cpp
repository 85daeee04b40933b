#include "gpumem/report/snapshot_render.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gpumem {

namespace {

std::string hex_address(std::int64_t a) { return fmt::format("0x{:x}", static_cast<std::uint64_t>(a)); }

nlohmann::json replay_json(const sim::ReplayResult& r) {
    nlohmann::json j;
    j["peak_allocated"] = r.peak_allocated.count();
    j["peak_reserved"] = r.peak_reserved.count();
    j["peak_event"] = r.peak_event;
    j["final_allocated"] = r.final_allocated.count();
    j["final_reserved"] = r.final_reserved.count();
    j["fragmentation_at_peak"] = r.fragmentation_at_peak.count();
    j["largest_free_block_at_peak"] = r.largest_free_block_at_peak.count();
    j["segments_created"] = r.allocator.cuda_mallocs;
    j["segments_released"] = r.allocator.cuda_frees;
    j["top_at_peak"] = nlohmann::json::array();
    for (const auto& t : r.top_at_peak) j["top_at_peak"].push_back({{"id", t.id}, {"bytes", t.size.count()}, {"label", t.label}});
    if (r.oom) {
        j["oom"] = {{"event", r.oom_event},
                    {"requested", r.oom->requested.count()},
                    {"allocated", r.oom->allocated.count()},
                    {"reserved", r.oom->reserved.count()},
                    {"capacity", r.oom->capacity.count()},
                    {"largest_free_block", r.oom->largest_free_block.count()}};
    } else {
        j["oom"] = nullptr;
    }
    return j;
}

struct Row {
    const char* key;
    Bytes bytes;
    std::string detail;
};

std::vector<Row> metric_rows(const sim::SnapshotSummary& s, const sim::ReplayResult* r) {
    std::vector<Row> rows = {
        {"reserved", s.reserved,
         fmt::format("{} segments ({} small, {} large): memory_reserved() at the dump", s.segments, s.small_segments, s.large_segments)},
        {"allocated", s.allocated, fmt::format("{} active blocks: memory_allocated() at the dump", s.active_blocks)},
        {"requested", s.requested, "what the program asked for, before rounding"},
        {"active_pending_free", s.active_pending_free, fmt::format("{} blocks freed, waiting on stream events", s.pending_free_blocks)},
        {"inactive", s.inactive, fmt::format("{} cached free blocks", s.inactive_blocks)},
        {"fragmentation", s.fragmentation, "reserved - allocated"},
        {"largest_free_block", s.largest_free_block, "largest cached free block"},
    };
    if (r) {
        rows.push_back({"replay.peak_allocated", r->peak_allocated, "max_memory_allocated() of the replayed trace"});
        rows.push_back({"replay.peak_reserved", r->peak_reserved, "max_memory_reserved() of the replayed trace"});
        rows.push_back({"replay.final_allocated", r->final_allocated, "after the last event (compare: allocated)"});
        rows.push_back({"replay.final_reserved", r->final_reserved, "after the last event (compare: reserved)"});
        rows.push_back({"replay.fragmentation_at_peak", r->fragmentation_at_peak, "reserved - allocated at the allocated peak"});
    }
    return rows;
}

std::string source_line(const sim::SnapshotSummary& s) {
    std::string fmt_desc = s.format == "pickle" ? fmt::format("pickle protocol {}", s.pickle_protocol) : s.format;
    std::string devs;
    for (int d : s.devices) devs += (devs.empty() ? "" : ", ") + std::to_string(d);
    return fmt::format("snapshot {} ({}, layout {}, device{} {})", s.origin, fmt_desc, sim::snapshot_layout_name(s.layout),
                       s.devices.size() == 1 ? "" : "s", devs.empty() ? "none" : devs);
}

}  // namespace

nlohmann::json snapshot_to_json(const sim::SnapshotSummary& s, const sim::ReplayResult* replay) {
    nlohmann::json j;
    j["peak_allocated"] = replay ? replay->peak_allocated.count() : s.allocated.count();
    j["peak_reserved"] = replay ? replay->peak_reserved.count() : s.reserved.count();
    j["peak_source"] = replay ? "replay" : "snapshot_state";
    j["source"] = {{"file", s.origin},
                   {"format", s.format},
                   {"pickle_protocol", s.pickle_protocol},
                   {"layout", sim::snapshot_layout_name(s.layout)},
                   {"devices", s.devices}};
    j["snapshot"] = {
        {"reserved", s.reserved.count()},
        {"allocated", s.allocated.count()},
        {"requested", s.requested.count()},
        {"active_pending_free", s.active_pending_free.count()},
        {"inactive", s.inactive.count()},
        {"fragmentation", s.fragmentation.count()},
        {"largest_free_block", s.largest_free_block.count()},
        {"segments", s.segments},
        {"small_segments", s.small_segments},
        {"large_segments", s.large_segments},
        {"expandable_segments", s.expandable_segments},
        {"small_reserved", s.small_reserved.count()},
        {"large_reserved", s.large_reserved.count()},
        {"blocks", s.blocks},
        {"active_blocks", s.active_blocks},
        {"pending_free_blocks", s.pending_free_blocks},
        {"inactive_blocks", s.inactive_blocks},
    };
    j["segment_sizes"] = nlohmann::json::array();
    for (const auto& b : s.segment_sizes)
        j["segment_sizes"].push_back({{"bucket", b.label}, {"min_exclusive", b.min.count()}, {"max", b.max.count()},
                                      {"count", b.count}, {"bytes", b.bytes.count()}});
    j["top_allocations"] = nlohmann::json::array();
    for (const auto& a : s.top_allocations)
        j["top_allocations"].push_back({{"address", a.address}, {"bytes", a.size.count()}, {"requested", a.requested.count()},
                                        {"stream", a.stream}, {"device", a.device}, {"frame", a.frame}});
    j["traces"] = nlohmann::json::array();
    for (const auto& t : s.traces)
        j["traces"].push_back({{"device", t.device},
                               {"entries", t.entries},
                               {"alloc", t.alloc},
                               {"free_requested", t.free_requested},
                               {"free_completed", t.free_completed},
                               {"segment_alloc", t.segment_alloc},
                               {"segment_free", t.segment_free},
                               {"segment_map", t.segment_map},
                               {"segment_unmap", t.segment_unmap},
                               {"snapshot", t.snapshot},
                               {"oom", t.oom},
                               {"other", t.other}});
    j["ooms"] = nlohmann::json::array();
    for (const auto& o : s.ooms)
        j["ooms"].push_back({{"device", o.device}, {"entry", o.entry}, {"requested", o.requested.count()},
                             {"device_free", o.device_free.count()}, {"time_us", o.time_us}, {"frame", o.frame}});
    j["allocator_settings"] = nlohmann::json::object();
    for (const auto& [k, v] : s.allocator_settings) j["allocator_settings"][k] = v;
    if (s.conversion) {
        const auto& c = *s.conversion;
        j["trace_conversion"] = {{"device", c.device},     {"source", c.source},
                                 {"events", c.events},     {"allocs", c.allocs},
                                 {"frees", c.frees},       {"free_action", c.free_action},
                                 {"seeded", c.seeded},     {"seeded_bytes", c.seeded_bytes.count()},
                                 {"implicit_frees", c.implicit_frees}, {"unmatched_frees", c.unmatched_frees},
                                 {"ignored", c.ignored},   {"ooms", c.ooms}};
    } else {
        j["trace_conversion"] = nullptr;
    }
    j["replay_config"] = s.replay_config;
    j["replay"] = replay ? replay_json(*replay) : nlohmann::json(nullptr);
    j["notes"] = s.notes;
    return j;
}

std::string render_snapshot(const sim::SnapshotSummary& s, const sim::ReplayResult* replay, Format f) {
    if (f == Format::Json) return snapshot_to_json(s, replay).dump(2) + "\n";
    Table t;
    t.header = {"metric", "bytes", "size", "detail"};
    t.right_align = {false, true, true, false};
    for (const auto& r : metric_rows(s, replay))
        t.rows.push_back({r.key, std::to_string(r.bytes.count()), format_bytes(r.bytes), r.detail});
    if (f == Format::Csv) return render_table(t, f);

    const bool md = f == Format::Markdown;
    std::string out = md ? "### " + source_line(s) + "\n\n" : source_line(s) + "\n\n";
    out += render_table(t, f);

    if (replay && s.conversion) {
        const auto& c = *s.conversion;
        std::string line = fmt::format("replay of device {} ({}: {} events, {} allocs, {} frees{}), allocator config {}: peak {} allocated / {} reserved",
                                       c.device, c.source, c.events, c.allocs, c.frees,
                                       c.free_action.empty() ? "" : ", frees at " + c.free_action,
                                       s.replay_config.empty() ? "default" : s.replay_config,
                                       format_bytes(replay->peak_allocated), format_bytes(replay->peak_reserved));
        out += "\n" + line + "\n";
        if (replay->oom)
            out += fmt::format("replay ran out of memory at event {}: {} requested with {} reserved of {}\n", replay->oom_event,
                               format_bytes(replay->oom->requested), format_bytes(replay->oom->reserved),
                               format_bytes(replay->oom->capacity));
    }

    if (!s.top_allocations.empty()) {
        Table a;
        a.header = {"largest allocations at the dump", "size", "requested", "stream", "address"};
        a.right_align = {false, true, true, true, false};
        for (const auto& x : s.top_allocations)
            a.rows.push_back({x.frame.empty() ? "<no frame>" : x.frame, format_bytes(x.size), format_bytes(x.requested),
                              std::to_string(x.stream), hex_address(x.address)});
        out += "\n" + render_table(a, f);
    }
    if (replay && !replay->top_at_peak.empty()) {
        Table a;
        a.header = {"largest allocations at the replay peak", "size"};
        a.right_align = {false, true};
        for (const auto& x : replay->top_at_peak) a.rows.push_back({x.label.empty() ? "<no frame>" : x.label, format_bytes(x.size)});
        out += "\n" + render_table(a, f);
    }
    {
        Table h;
        h.header = {"segment size", "segments", "bytes"};
        h.right_align = {false, true, true};
        for (const auto& b : s.segment_sizes)
            if (b.count) h.rows.push_back({b.label, std::to_string(b.count), format_bytes(b.bytes)});
        if (!h.rows.empty()) out += "\n" + render_table(h, f);
    }
    if (!s.traces.empty()) {
        Table tr;
        tr.header = {"device", "entries", "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"};
        tr.right_align = std::vector<bool>(8, true);
        for (const auto& x : s.traces)
            tr.rows.push_back({std::to_string(x.device), std::to_string(x.entries), std::to_string(x.alloc),
                               std::to_string(x.free_requested), std::to_string(x.free_completed), std::to_string(x.segment_alloc),
                               std::to_string(x.segment_free), std::to_string(x.oom)});
        out += "\n" + render_table(tr, f);
    }
    for (const auto& o : s.ooms)
        out += fmt::format("{}OOM on device {} (trace entry {}): tried to allocate {} with {} free on the device{}\n", md ? "\n- " : "\n",
                           o.device, o.entry, format_bytes(o.requested), format_bytes(o.device_free),
                           o.frame.empty() ? "" : " at " + o.frame);
    if (!s.allocator_settings.empty()) {
        std::string line;
        for (const auto& [k, v] : s.allocator_settings) line += (line.empty() ? "" : ", ") + k + "=" + (v.empty() ? "\"\"" : v);
        out += "\nallocator settings: " + line + "\n";
    }
    if (!s.notes.empty()) {
        out += md ? "\nNotes:\n\n" : "\nnotes:\n";
        for (const auto& n : s.notes) out += (md ? "- " : "  - ") + n + "\n";
    }
    return out;
}

}  // namespace gpumem
