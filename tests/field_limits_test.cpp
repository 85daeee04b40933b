// The documented value limits (issue 15, docs/limits.md): every request field
// has a range checked on JSON and command-line text alike, before any cast;
// values just outside it are refused naming the field, the range and the fix;
// overflow of checked arithmetic names the inputs that made the job too
// large; absurd config / Megatron / DeepSpeed values are input errors (exit 2),
// never a signal, an internal error or a wrapped byte count.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "gpumem/api/api.hpp"
#include "gpumem/core/limits.hpp"
#include "gpumem/memory/fields.hpp"
#include "gpumem/plan/compat_megatron.hpp"
#include "test_util.hpp"

using namespace gpumem;
using json = nlohmann::json;
using gpumem::test::run_cli;

namespace {

// A command the field applies to.
Command command_of(const Field& f) {
    for (Command c : all_commands())
        if (f.in(c)) return c;
    return Command::Estimate;
}

bool whole(const Field& f) { return f.type == FieldType::Int || f.type == FieldType::IntList || f.type == FieldType::Count || f.type == FieldType::Size; }

// The value v in the shape the field takes (a list field: a one-entry list).
json shaped(const Field& f, const json& v) { return f.type == FieldType::IntList ? json::array({v}) : v; }

std::string temp_file(const std::string& name, const std::string& content) { return gpumem::test::process_scratch().write(name, content); }


}  // namespace

// Every numeric field carries a range, and every list field a length limit:
// nothing whose size drives work is unbounded.
TEST(FieldLimits, EveryNumericFieldHasARangeAndEveryListALength) {
    for (const Field& f : fields()) {
        switch (f.type) {
            case FieldType::Int:
            case FieldType::Number:
            case FieldType::Size:
            case FieldType::Percent:
            case FieldType::Count:
            case FieldType::IntList:
                EXPECT_TRUE(f.min.has_value()) << f.name;
                EXPECT_TRUE(f.max.has_value()) << f.name;
                break;
            default: break;
        }
        if (f.type == FieldType::IntList || f.type == FieldType::StringList || f.type == FieldType::EnumList) {
            EXPECT_TRUE(f.max_items.has_value()) << f.name;
        }
        // Fields that land in an `int` member (threads, ZeRO stages) stay within it.
        if (f.max && whole(f) && (f.name == "threads" || f.name == "zero" || f.name == "only-zero" || f.name == "fsdp-version" || f.name == "stage")) {
            EXPECT_LE(*f.max, static_cast<double>(INT_MAX)) << f.name;
        }
    }
    // The table's JSON (GET /v1/fields, Python's fields()) carries the limits.
    const json fj = fields_json();
    const auto it = std::find_if(fj["fields"].begin(), fj["fields"].end(), [](const json& x) { return x["name"] == "gpus"; });
    ASSERT_NE(it, fj["fields"].end());
    EXPECT_EQ((*it)["max"], 1048576.0);
    EXPECT_FALSE((*it)["limit"].get<std::string>().empty());
}

// The generated property: for every field in the table, a value just above
// its max and just below its min is refused, as JSON and as command-line
// text, naming that field; the bounds themselves are accepted.
TEST(FieldLimits, JustOutsideEveryRangeIsRefusedNamingTheField) {
    int checked = 0;
    for (const Field& f : fields()) {
        if (!f.min && !f.max) continue;
        const Command c = command_of(f);
        const auto refused = [&](const json& raw, const char* side) {
            auto r = parse_request(c, json{{f.json_key(), shaped(f, raw)}});
            ASSERT_FALSE(r.ok()) << f.name << " " << side << " " << raw.dump();
            EXPECT_EQ(r.error().field, f.name) << r.error().message;
            EXPECT_EQ(r.error().code, ErrorCode::InvalidArgument) << f.name;
            EXPECT_EQ(r.error().message.rfind(f.flag() + ": ", 0), 0u) << r.error().message;
            EXPECT_NE(r.error().message.find(std::string("must be ") + side), std::string::npos) << r.error().message;
            // The fix: the allowed range.
            if (f.min && f.max) {
                EXPECT_NE(r.error().message.find(" from "), std::string::npos) << r.error().message;
            }
            // Through the full API (the service's and Python's path) too.
            auto a = api_call(to_string(c), json{{f.json_key(), shaped(f, raw)}});
            ASSERT_FALSE(a.ok()) << f.name;
            EXPECT_EQ(a.error().field, f.name) << a.error().message;
        };
        const auto accepted = [&](const json& raw) {
            auto v = canonical_value(f, shaped(f, raw));
            EXPECT_TRUE(v.ok()) << f.name << " " << raw.dump() << ": " << (v.ok() ? "" : v.error().message);
        };
        if (whole(f)) {
            if (f.max) {
                const auto hi = static_cast<std::int64_t>(*f.max);
                refused(json(hi + 1), "at most");
                accepted(json(hi));
                // As command-line text (list fields: "1,2,hi+1").
                if (f.type != FieldType::Size) {
                    auto t = canonical_value(f, json(std::to_string(hi + 1)));
                    ASSERT_FALSE(t.ok()) << f.name;
                    EXPECT_EQ(t.error().field, f.name);
                }
            }
            if (f.min) {
                const auto lo = static_cast<std::int64_t>(*f.min);
                refused(json(lo - 1), "at least");
                accepted(json(lo));
            }
        } else {
            // Real numbers (fractions included): a step far below the bound's
            // scale but above rounding.
            if (f.max) {
                const double hi = *f.max;
                if (!(f.type == FieldType::Percent && hi + 1e-6 >= 1)) refused(json(hi + std::max(1e-6, hi * 1e-9)), "at most");
                accepted(json(hi));
            }
            if (f.min) {
                const double lo = *f.min;
                refused(json(lo - std::max(1e-6, std::fabs(lo) * 1e-9)), "at least");
                accepted(json(lo));
            }
        }
        ++checked;
    }
    EXPECT_GT(checked, 60);
}

// List lengths: one entry over the limit is refused naming the field.
TEST(FieldLimits, ListLengths) {
    for (const Field& f : fields()) {
        if (!f.max_items) continue;
        json list = json::array();
        for (std::int64_t i = 0; i <= *f.max_items; ++i) {
            if (f.type == FieldType::IntList) list.push_back(f.min ? static_cast<std::int64_t>(*f.min) : 1);
            else if (f.type == FieldType::EnumList) list.push_back(f.values.front());
            else list.push_back("x");
        }
        auto r = canonical_value(f, list);
        ASSERT_FALSE(r.ok()) << f.name;
        EXPECT_EQ(r.error().field, f.name);
        EXPECT_NE(r.error().message.find("give at most " + std::to_string(*f.max_items)), std::string::npos) << r.error().message;
        list.erase(list.end() - 1);
        EXPECT_TRUE(canonical_value(f, list).ok()) << f.name;
    }
    // A sweep's points: 17 x 17 = 289 > 256.
    json b = json::array();
    for (int i = 1; i <= 17; ++i) b.push_back(i);
    auto r = parse_request(Command::Sweep, json{{"model", "gpt2"}, {"batches", b}, {"seqs", b}});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().field, "batches");
    EXPECT_NE(r.error().message.find("289 sweep points; give at most 256"), std::string::npos) << r.error().message;
}

// The cases of the issue, with their exact messages: JSON numbers are
// range-checked before any cast.
TEST(FieldLimits, IssueCasesThroughTheApi) {
    const auto err = [](const char* cmd, const json& body) {
        auto r = api_call(cmd, body);
        EXPECT_FALSE(r.ok()) << body.dump();
        return r.ok() ? Error{} : r.error();
    };
    // top: 1e30 (used to print -9223372036854775808).
    Error e = err("plan", {{"model", "gpt2"}, {"top", 1e30}});
    EXPECT_EQ(e.field, "top");
    EXPECT_EQ(e.message, "--top: must be at most 10000 (got 1e+30); give a whole number from 1 to 10000 (limit 10,000 layouts: a search finds at most a few thousand)");
    // only_zero: 2^32 + 3 (used to become ZeRO 3 through an int cast), and zero itself.
    e = err("plan", {{"model", "gpt2"}, {"only_zero", {4294967299LL}}});
    EXPECT_EQ(e.field, "only-zero");
    EXPECT_EQ(e.message.rfind("--only-zero: must be at most 3 (got 4294967299); give a whole number from 0 to 3", 0), 0u) << e.message;
    e = err("estimate", {{"model", "gpt2"}, {"zero", 4294967299LL}});
    EXPECT_EQ(e.field, "zero");
    EXPECT_EQ(e.message, "--zero: must be at most 3 (got 4294967299); give a whole number from 0 to 3");
    // Non-integral numbers for integer fields.
    e = err("estimate", {{"model", "gpt2"}, {"batch", 2.5}});
    EXPECT_EQ(e.field, "batch");
    EXPECT_EQ(e.message.rfind("--batch: must be a whole number (got 2.5); give a whole number from 1 to 1048576", 0), 0u) << e.message;
    // cuda_context: -9e18 (used to answer fits: true with a negative total).
    e = err("estimate", {{"model", "gpt2"}, {"cuda_context", -9e18}});
    EXPECT_EQ(e.field, "cuda-context");
    EXPECT_EQ(e.message.rfind("--cuda-context: must be at least 1B (got -9e+18); give a size from 1B to 1024TiB", 0), 0u) << e.message;
    // gpu_memory 0 and -1.
    for (const json& v : {json(0), json(-1), json("0"), json("-1GiB")}) {
        e = err("estimate", {{"model", "gpt2"}, {"gpu_memory", v}});
        EXPECT_EQ(e.field, "gpu-memory") << v.dump();
        EXPECT_NE(e.message.find("must be at least 1B"), std::string::npos) << e.message;
    }
    // threads: 200000 (used to abort when thread creation failed).
    e = err("plan", {{"model", "gpt2"}, {"threads", 200000}});
    EXPECT_EQ(e.field, "threads");
    EXPECT_EQ(e.message.rfind("--threads: must be at most 1024 (got 200000)", 0), 0u) << e.message;
    // Above int64 itself, as a JSON number and as text.
    e = err("estimate", {{"model", "gpt2"}, {"grad_accum", 18446744073709551615ULL}});
    EXPECT_EQ(e.field, "grad-accum");
    EXPECT_EQ(e.message.rfind("--grad-accum: must be at most 1048576 (got 18446744073709551615)", 0), 0u) << e.message;
    e = err("estimate", {{"model", "gpt2"}, {"seq", "99999999999999999999999"}});
    EXPECT_EQ(e.field, "seq");
    EXPECT_EQ(e.message.rfind("--seq: must be at most 16777216 (got 99999999999999999999999)", 0), 0u) << e.message;
    // A parameter count beyond the limit, as a number and as text.
    e = err("estimate", {{"params", "20000T"}});
    EXPECT_EQ(e.field, "params");
    EXPECT_NE(e.message.find("must be at most 1000000000000000"), std::string::npos) << e.message;
}

// The same through the command line: exit 2, one line, the field named.
TEST(FieldLimits, IssueCasesThroughTheCli) {
    test::expect_input_error(run_cli("plan gpt2 --top 1e30"), "--top: must be at most 10000 (got 1e30)");
    test::expect_input_error(run_cli("plan gpt2 --only-zero 4294967299"), "--only-zero: must be at most 3");
    test::expect_input_error(run_cli("estimate gpt2 --cuda-context -9e18"), "--cuda-context: must be at least 1B (got -9e18)");
    test::expect_input_error(run_cli("estimate gpt2 --gpu-memory 0"), "--gpu-memory: must be at least 1B (got 0)");
    test::expect_input_error(run_cli("estimate gpt2 --gpu-memory -1"), "--gpu-memory: must be at least 1B");
    test::expect_input_error(run_cli("estimate gpt2 --batch 2.5"), "--batch: must be a whole number (got 2.5)");
    test::expect_input_error(run_cli("plan gpt2 --threads 200000 --top 1"), "--threads: must be at most 1024 (got 200000)");
    test::expect_input_error(run_cli("estimate gpt2 --gpus 1048577"), "--gpus: must be at most 1048576 (got 1048577)");
    test::expect_input_error(run_cli("estimate gpt2 --grad-accum 1e9"), "--grad-accum: must be at most 1048576 (got 1e9)");
    test::expect_input_error(run_cli("compat deepspeed --params 7B --largest-layer-params 2.5x --stage 3"), "(--largest-layer-params)");
    test::expect_input_error(run_cli("compat deepspeed --params 2e15 --stage 3"), "--params: must be at most 1000000000000000");
}

// Checked arithmetic that overflows while computing a job names the inputs
// that made it too large, and which to reduce.
TEST(FieldLimits, OverflowNamesTheInputs) {
    // gpt2's attention-score shape: batch x heads x seq x seq = 1,048,576 x 12 x 10^12
    // ~ 1.26e19 elements > 2^63 ~ 9.22e18 (each of batch and seq is within its own limit).
    const double scores = 1048576.0 * 12.0 * 1e6 * 1e6;
    ASSERT_GT(scores, 9.3e18);
    const auto r = run_cli("estimate gpt2 --batch 1048576 --seq 1000000 --analytic");
    test::expect_input_error(r, "the job is too large to represent");
    EXPECT_NE(r.err.find("with --batch 1048576, --seq 1000000; reduce --batch or --seq"), std::string::npos) << r.err;
    // Through the API: an Overflow error with the field named.
    auto a = api_call("estimate", {{"model", "gpt2"}, {"batch", 1048576}, {"seq", 1000000}, {"analytic", true}});
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().code, ErrorCode::Overflow);
    EXPECT_EQ(a.error().field, "batch");
}

// Hugging Face configs: layer counts are limited, sizes whose products pass
// 64 bits are named.
TEST(FieldLimits, HfConfigValues) {
    json cfg = test::read_json("data/presets/configs/llama-3-8b.json");
    json deep = cfg;
    deep["num_hidden_layers"] = 1000000000;
    test::expect_input_error(run_cli("estimate " + temp_file("deep.json", deep.dump())),
                 "field \"num_hidden_layers\" must be at most 100000 layers (got 1000000000)");
    // 2^31 - 1 in every size: 100,000 layers x (3 x 2^31 x 2^31 MLP + 4 x 2^31 x 2^31 attention)
    // ~ 3.2e24 parameters, far beyond 2^63 / 64 ~ 1.4e17.
    json big = cfg;
    for (const char* k : {"hidden_size", "intermediate_size", "vocab_size"}) big[k] = 2147483647;
    big["num_attention_heads"] = 1;
    big["num_key_value_heads"] = 1;
    big["num_hidden_layers"] = 100000;
    const auto r = run_cli("params " + temp_file("big.json", big.dump()));
    test::expect_input_error(r, "the model is too large to represent");
    EXPECT_NE(r.err.find("hidden_size=2147483647, intermediate_size=2147483647, vocab_size=2147483647, num_hidden_layers=100000"), std::string::npos) << r.err;
    // Inline through the API (the service's path).
    auto a = api_call("estimate", {{"config", big}});
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().code, ErrorCode::Overflow);
    EXPECT_EQ(a.error().field, "hidden_size");
    // A fractional size.
    json frac = cfg;
    frac["hidden_size"] = 4096.5;
    test::expect_input_error(run_cli("estimate " + temp_file("frac.json", frac.dump())), "\"hidden_size\" must be a positive integer");
}

// Megatron argument files: every integer argument is bounded, and a report
// whose bytes a 64-bit integer cannot hold is an error naming the arguments
// (it used to print -9223372036854775808 with exit 0).
TEST(FieldLimits, MegatronValues) {
    const json base = {{"num_layers", 24}, {"hidden_size", 2048}, {"num_attention_heads", 16}, {"vocab_size", 50257},
                       {"seq_length", 2048}, {"micro_batch_size", 4}, {"tensor_model_parallel_size", 2}, {"world_size", 8}};
    const auto with = [&](const char* k, const json& v) {
        json j = base;
        j[k] = v;
        return j;
    };
    auto e = megatron_args_from_json(with("num_layers", 9223372036854775807LL));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "num_layers");
    EXPECT_EQ(e.error().message.rfind("Megatron argument num_layers must be at most 100000 (got 9223372036854775807)", 0), 0u) << e.error().message;
    e = megatron_args_from_json(with("micro_batch_size", 4294967299LL));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "micro_batch_size");
    e = megatron_args_from_json(with("num_microbatches", json(18446744073709551615ULL)));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "num_microbatches");
    e = megatron_args_from_json(with("seq_length", "99999999999999999999"));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "seq_length");
    EXPECT_NE(e.error().message.find("must be at most 16777216"), std::string::npos) << e.error().message;
    e = megatron_args_from_json(with("moe_layer_freq", 1000000000));
    // moe_layer_freq matters with experts only, but its value is still bounded.
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().field, "moe_layer_freq");

    // Each argument within its limit, but the activations s*b*h*L*... pass 2^63 bytes:
    // 2^24 x 2^20 x 2^16 = 2^60 elements per layer output before the x(10 + 24/tp) and x L factors.
    json big = base;
    big["num_layers"] = 100000;
    big["hidden_size"] = 65536;
    big["num_attention_heads"] = 1;
    big["seq_length"] = 16777216;
    big["micro_batch_size"] = 1048576;
    big["tensor_model_parallel_size"] = 1;
    const std::string path = temp_file("megatron-big.json", big.dump());
    const auto r = run_cli("compat megatron " + path + " --format json");
    test::expect_input_error(r, "too large to represent");
    EXPECT_NE(r.err.find("num_layers=100000, hidden_size=65536, seq_length=16777216, micro_batch_size=1048576"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("-9223372036854775808"), std::string::npos);
    // The largest dimensions: checked integer products overflow, named too.
    big["hidden_size"] = 2147483647;
    big["vocab_size"] = 2147483647;
    const auto r2 = run_cli("compat megatron " + temp_file("megatron-huge.json", big.dump()));
    test::expect_input_error(r2, "Megatron arguments: the sizes overflow 64-bit integers");
    EXPECT_NE(r2.err.find("hidden_size=2147483647"), std::string::npos) << r2.err;
}

// docs/limits.md lists every limited field of the table.
TEST(FieldLimits, DocumentedInLimitsMd) {
    std::ifstream f(test::source_path("docs/limits.md"));
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string doc = ss.str();
    ASSERT_FALSE(doc.empty());
    for (const Field& x : fields())
        if (!x.limit.empty()) {
            EXPECT_NE(doc.find("| `" + x.flag() + "` |"), std::string::npos) << x.name << " is missing from docs/limits.md";
        }
}
