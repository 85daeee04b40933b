// bench/snapshot_gen.hpp — large synthetic PyTorch memory snapshots, written
// the way torch.cuda.memory._dump_snapshot() writes them (pickle protocol 4,
// as Lib/pickle.py's Pickler does: every str/dict/list memoized with MEMOIZE,
// repeats of one object written as BINGET/LONG_BINGET, lists appended in
// batches of 1000 with MARK ... APPENDS, dicts filled with MARK ... SETITEMS),
// or as the same data in JSON (json.dump of the snapshot dict).
//
// The trace mimics a training loop: allocations of mixed sizes up to a pool of
// live blocks, each later freed with free_requested then free_completed (the
// free shares the alloc's frames list, as torch's py_symbolize dedups one
// traceback), a few segment_alloc entries, frees of addresses allocated before
// the trace began (the replay seeds them) and one oom. `events` counts trace
// entries. The generator also returns what it wrote (entry counts per action)
// so that a test can check the reader against it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace gpumem::bench {

struct SnapshotGenCounts {
    std::int64_t entries = 0, alloc = 0, free_requested = 0, free_completed = 0, segment_alloc = 0, oom = 0;
    std::int64_t seeded_frees = 0;  // free_* of addresses the trace never allocated
    std::int64_t active_blocks = 0; // blocks active at the dump (segments)
    // Live requested bytes when each free is taken at free_completed and the
    // allocations made before the trace (the frees above, the active blocks)
    // are live at its start: what a replay without an allocator model sees.
    std::int64_t seed_bytes = 0, peak_live = 0, final_live = 0;
};

class SnapshotGen {
public:
    explicit SnapshotGen(std::int64_t events, std::uint64_t seed = 1) : events_(events), rng_(seed) {}

    // Writes the snapshot to `path` as a pickle (json == false) or JSON.
    SnapshotGenCounts write(const std::string& path, bool json) {
        json_ = json;
        counts_ = {};
        oom_done_ = false;
        freed_.clear();
        rng_state_ = rng_;
        f_ = std::fopen(path.c_str(), "wb");
        if (!f_) return counts_;
        buf_.clear();
        memo_ = 0;
        key_memo_.assign(kKeys, -1);
        frame_memo_.assign(kFrameLists, -1);
        if (json_) put("{\"segments\": ");
        else put("\x80\x04", 2), begin_dict();
        if (!json_) key(K_segments);
        write_segments();
        if (json_) put(", \"device_traces\": [");
        else key(K_device_traces), begin_list(), mark_();
        write_trace();
        if (json_) put("], \"allocator_settings\": {\"PYTORCH_CUDA_ALLOC_CONF\": \"\", \"max_split_size\": -1}}");
        else {
            appends_();  // the device list
            key(K_allocator_settings);
            begin_dict();
            key(K_conf);
            str("");
            key(K_msplit);
            integer(-1);
            setitems_();
            setitems_();  // the root dict (opened by begin_dict's MARK below)
            put(".", 1);
        }
        flush();
        std::fclose(f_);
        return counts_;
    }

private:
    enum Key {
        K_segments, K_device_traces, K_allocator_settings, K_conf, K_msplit, K_action, K_addr, K_size, K_stream,
        K_time_us, K_frames, K_filename, K_line, K_name, K_alloc, K_free_requested, K_free_completed, K_segment_alloc,
        K_oom, K_device_free, K_device, K_address, K_total_size, K_allocated_size, K_active_size, K_segment_type,
        K_blocks, K_state, K_active_allocated, K_inactive, K_large, K_requested_size, kKeys
    };
    static constexpr const char* kKeyText[kKeys] = {
        "segments", "device_traces", "allocator_settings", "PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "action",
        "addr", "size", "stream", "time_us", "frames", "filename", "line", "name", "alloc", "free_requested",
        "free_completed", "segment_alloc", "oom", "device_free", "device", "address", "total_size", "allocated_size",
        "active_size", "segment_type", "blocks", "state", "active_allocated", "inactive", "large", "requested_size"};
    static constexpr int kFrameLists = 64;
    static constexpr int kLive = 2048;
    static constexpr std::int64_t kBase = 0x7f0000000000LL;

    std::uint64_t next() {
        rng_state_ ^= rng_state_ << 13;
        rng_state_ ^= rng_state_ >> 7;
        rng_state_ ^= rng_state_ << 17;
        return rng_state_;
    }

    // --- output -----------------------------------------------------------------
    void put(const char* s, std::size_t n) {
        buf_.append(s, n);
        if (buf_.size() > (1u << 20)) flush();
    }
    void put(const std::string& s) { put(s.data(), s.size()); }
    void flush() {
        if (!buf_.empty()) std::fwrite(buf_.data(), 1, buf_.size(), f_);
        buf_.clear();
    }
    void byte(unsigned v) {
        const char c = static_cast<char>(v);
        put(&c, 1);
    }
    void le(std::uint64_t v, int n) {
        for (int i = 0; i < n; ++i) byte(static_cast<unsigned>((v >> (8 * i)) & 0xff));
    }
    void memoize() {
        byte(0x94);
        ++memo_;
    }
    void get(std::int64_t idx) {
        if (idx < 256) byte('h'), byte(static_cast<unsigned>(idx));
        else byte('j'), le(static_cast<std::uint64_t>(idx), 4);
    }
    void mark_() { byte('('); }
    void appends_() { byte('e'); }
    void setitems_() { byte('u'); }
    void begin_dict() {
        byte('}');
        memoize();
        mark_();
    }
    void begin_list() {
        byte(']');
        memoize();
    }
    void str(const std::string& s) {
        if (json_) {
            put("\"" + s + "\"");
            return;
        }
        byte(0x8c);
        byte(static_cast<unsigned>(s.size()));
        put(s.data(), s.size());
        memoize();
    }
    void key(Key k) {
        if (json_) {
            put("\"" + std::string(kKeyText[k]) + "\": ");
            return;
        }
        if (key_memo_[k] >= 0) return get(key_memo_[k]);
        str(kKeyText[k]);
        key_memo_[k] = memo_ - 1;
    }
    // A string value torch shares between entries (one str object).
    void sym(Key k) {
        if (json_) str(kKeyText[k]);
        else key(k);
    }
    void integer(std::int64_t v) {
        if (json_) {
            put(std::to_string(v));
            return;
        }
        if (v >= 0 && v < 256) byte('K'), byte(static_cast<unsigned>(v));
        else if (v >= 0 && v < 65536) byte('M'), le(static_cast<std::uint64_t>(v), 2);
        else if (v >= INT32_MIN && v <= INT32_MAX) byte('J'), le(static_cast<std::uint64_t>(v), 4);
        else {
            // LONG1 with the fewest bytes of two's complement, as pickle.encode_long.
            int n = 1;
            while (n < 8 && !(v >= -(std::int64_t(1) << (8 * n - 1)) && v < (std::int64_t(1) << (8 * n - 1)))) ++n;
            byte(0x8a);
            byte(static_cast<unsigned>(n));
            le(static_cast<std::uint64_t>(v), n);
        }
    }
    // key: value pairs of a small dict in JSON need separators.
    void sep(bool& first) {
        if (json_ && !first) put(", ", 2);
        first = false;
    }
    void json_key(Key k, bool& first) {
        sep(first);
        key(k);
    }

    // --- content --------------------------------------------------------------
    void frames(int list) {
        // Two frames: the allocator's C++ frame, then a Python frame (the
        // reader prefers the first *.py one).
        if (!json_ && frame_memo_[list] >= 0) return get(frame_memo_[list]);
        if (json_) put("[", 1);
        else begin_list(), frame_memo_[list] = memo_ - 1, mark_();
        for (int k = 0; k < 2; ++k) {
            if (json_) put(k ? ", {" : "{");
            else begin_dict();
            bool first = true;
            json_key(K_filename, first);
            str(k == 0 ? "CUDACachingAllocator.cpp" : "model" + std::to_string(list % 16) + ".py");
            json_key(K_line, first);
            integer(k == 0 ? 1100 : 10 + list);
            json_key(K_name, first);
            str(k == 0 ? "malloc" : "f" + std::to_string(list));
            if (json_) put("}", 1);
            else setitems_();
        }
        if (json_) put("]", 1);
        else appends_();
    }
    void entry(Key action, std::int64_t addr, std::int64_t size, std::int64_t t, int frame_list, std::int64_t stream = 0) {
        if (json_) put(in_batch_ ? ", {" : "{");
        else begin_dict();
        in_batch_ = true;
        bool first = true;
        json_key(K_action, first);
        sym(action);  // the action strings are shared objects too
        if (action == K_oom) {
            json_key(K_device_free, first);
            integer(size / 2);
        } else {
            json_key(K_addr, first);
            integer(addr);
        }
        json_key(K_size, first);
        integer(size);
        json_key(K_stream, first);
        integer(stream);
        json_key(K_time_us, first);
        integer(t);
        json_key(K_frames, first);
        frames(frame_list);
        if (json_) put("}", 1);
        else setitems_();
        ++counts_.entries;
        if (!json_ && ++batch_ == 1000) {
            appends_();
            mark_();
            batch_ = 0;
        }
    }

    void write_segments() {
        // One large segment with active blocks allocated before the trace.
        const std::int64_t seg = kBase - (std::int64_t(1) << 32);
        const int nblocks = 8;
        const std::int64_t bsize = 2 << 20;
        if (json_) put("[{", 2);
        else begin_list(), mark_(), begin_dict();
        bool first = true;
        json_key(K_device, first), integer(0);
        json_key(K_address, first), integer(seg);
        json_key(K_total_size, first), integer(bsize * nblocks);
        json_key(K_allocated_size, first), integer(bsize * nblocks / 2);
        json_key(K_active_size, first), integer(bsize * nblocks / 2);
        json_key(K_stream, first), integer(0);
        json_key(K_segment_type, first), sym(K_large);
        json_key(K_blocks, first);
        if (json_) put("[", 1);
        else begin_list(), mark_();
        for (int b = 0; b < nblocks; ++b) {
            const bool active = b % 2 == 0;
            if (json_) put(b ? ", {" : "{");
            else begin_dict();
            bool f2 = true;
            json_key(K_address, f2), integer(seg + b * bsize);
            json_key(K_size, f2), integer(bsize);
            json_key(K_requested_size, f2), integer(bsize - 512 * b);
            json_key(K_state, f2), sym(active ? K_active_allocated : K_inactive);
            json_key(K_frames, f2), frames(b);
            if (json_) put("}", 1);
            else setitems_();
            counts_.active_blocks += active;
            if (active) counts_.seed_bytes += bsize - 512 * b;
        }
        if (json_) put("]}]", 3);
        else appends_(), setitems_(), appends_();
    }

    void write_trace() {
        struct LiveBlock {
            std::int64_t addr, size;
            int frames;
        };
        std::vector<LiveBlock> live;
        std::int64_t next_addr = kBase, t = 1'700'000'000'000'000;
        if (json_) put("[", 1);
        else begin_list(), mark_();
        in_batch_ = false;
        batch_ = 0;
        // Frees of blocks allocated before the trace began.
        for (int i = 0; i < 4 && counts_.entries + 2 <= events_; ++i) counts_.seed_bytes += 1 << 20;
        std::int64_t cur = counts_.seed_bytes;
        counts_.peak_live = cur;
        for (int i = 0; i < 4 && counts_.entries + 2 <= events_; ++i) {
            const std::int64_t a = kBase - (std::int64_t(1) << 30) + i * (1 << 20);
            entry(K_free_requested, a, 1 << 20, t++, i);
            entry(K_free_completed, a, 1 << 20, t++, i);
            cur -= 1 << 20;
            ++counts_.free_requested, ++counts_.free_completed, ++counts_.seeded_frees;
        }
        while (counts_.entries < events_) {
            const std::uint64_t r = next();
            const std::int64_t left = events_ - counts_.entries;
            const bool do_free = !live.empty() && left >= 2 && (live.size() >= kLive || (r & 3) == 0 || left < 3);
            if (do_free) {
                const std::size_t k = static_cast<std::size_t>((r >> 8) % live.size());
                const LiveBlock b = live[k];
                live[k] = live.back();
                live.pop_back();
                entry(K_free_requested, b.addr, b.size, t++, b.frames);
                entry(K_free_completed, b.addr, b.size, t++, b.frames);
                cur -= b.size;
                ++counts_.free_requested, ++counts_.free_completed;
                if (freed_.size() < 4096) freed_.push_back(b.addr);
                continue;
            }
            if (!oom_done_ && counts_.entries >= events_ / 2) {
                oom_done_ = true;
                entry(K_oom, 0, std::int64_t(1) << 40, t++, 5);
                ++counts_.oom;
                continue;
            }
            if ((r >> 40) % 64 == 0) {
                entry(K_segment_alloc, next_addr, 20 << 20, t++, 1);
                ++counts_.segment_alloc;
                continue;
            }
            // Sizes from 512 B to 64 MiB, most small (a training step's mix).
            const int shift = 9 + static_cast<int>((r >> 16) % 18);
            const std::int64_t size = (std::int64_t(1) << shift) + static_cast<std::int64_t>((r >> 32) % 512) * 512;
            const int fl = static_cast<int>((r >> 48) % kFrameLists);
            // Addresses are reused as a caching allocator would: a freed
            // block's address comes back.
            std::int64_t addr;
            if (!freed_.empty() && (r >> 60) % 2 == 0) {
                addr = freed_.back();
                freed_.pop_back();
            } else {
                addr = next_addr;
                next_addr += 64 << 20;
            }
            entry(K_alloc, addr, size, t++, fl);
            cur += size;
            counts_.peak_live = std::max(counts_.peak_live, cur);
            ++counts_.alloc;
            live.push_back(LiveBlock{addr, size, fl});
        }
        counts_.final_live = cur;
        if (json_) put("]", 1);
        else appends_();
    }

    std::int64_t events_;
    std::uint64_t rng_;
    std::uint64_t rng_state_ = 0;
    bool json_ = false;
    std::FILE* f_ = nullptr;
    std::string buf_;
    std::int64_t memo_ = 0;
    std::vector<std::int64_t> key_memo_, frame_memo_;
    std::vector<std::int64_t> freed_;
    SnapshotGenCounts counts_;
    bool in_batch_ = false;
    bool oom_done_ = false;
    int batch_ = 0;
};

}  // namespace gpumem::bench
