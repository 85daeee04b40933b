// Batch / sequence sweeps (plan/sweep.hpp) and their renderers.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumem/memory/estimate.hpp"
#include "gpumem/plan/sweep.hpp"
#include "gpumem/report/sweep_render.hpp"

namespace gpumem {
namespace {

SweepRequest gpt2(std::vector<std::int64_t> batches, std::vector<std::int64_t> seqs, bool simulate, Attention attention = Attention::Flash) {
    SweepRequest r;
    r.base.model = "gpt2";
    r.base.attention = attention;
    r.batches = std::move(batches);
    r.seqs = std::move(seqs);
    r.simulate = simulate;
    return r;
}

SweepResult run(const SweepRequest& r) {
    auto s = sweep(r);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    return s.value();
}

Bytes total_at(std::int64_t batch, std::int64_t seq) {
    EstimateRequest r;
    r.model = "gpt2";
    r.batch = batch;
    r.seq = seq;
    auto e = estimate(r);
    EXPECT_TRUE(e.ok());
    return e.value().per_gpu.total_device;
}

// Tags open and close in order; self-closing tags need no partner.
bool balanced_tags(const std::string& svg) {
    std::vector<std::string> stack;
    std::size_t pos = 0;
    while ((pos = svg.find('<', pos)) != std::string::npos) {
        const std::size_t end = svg.find('>', pos);
        if (end == std::string::npos) return false;
        const std::string tag = svg.substr(pos + 1, end - pos - 1);
        pos = end + 1;
        if (tag.empty()) return false;
        const bool closing = tag[0] == '/';
        const bool self = tag.back() == '/';
        const std::string name = tag.substr(closing ? 1 : 0, tag.find_first_of(" /", closing ? 1 : 0) - (closing ? 1 : 0));
        if (self) continue;
        if (closing) {
            if (stack.empty() || stack.back() != name) return false;
            stack.pop_back();
        } else {
            stack.push_back(name);
        }
    }
    return stack.empty();
}

std::size_t count(const std::string& s, const std::string& needle) {
    std::size_t n = 0;
    for (std::size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + needle.size())) ++n;
    return n;
}

TEST(SweepParse, IntLists) {
    auto ok = parse_int_list("1,2, 4 ,8", "--batch");
    ASSERT_TRUE(ok.ok());
    EXPECT_EQ(ok.value(), (std::vector<std::int64_t>{1, 2, 4, 8}));

    auto bad = parse_int_list("1,x,4", "--batch");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().message, "--batch: \"x\" is not a positive integer");
    EXPECT_EQ(bad.error().field, "batch");
    EXPECT_EQ(bad.error().code, ErrorCode::InvalidArgument);

    for (const char* text : {"", " ", "0", "-1", "1,,2", "2,", "1.5", "4k", "1,2,1", "99999999999999999999"}) {
        auto r = parse_int_list(text, "seq");
        ASSERT_FALSE(r.ok()) << text;
        EXPECT_EQ(r.error().field, "seq") << text;
        EXPECT_EQ(r.error().message.rfind("--seq: ", 0), 0u) << r.error().message;
    }
    EXPECT_EQ(parse_int_list("1,2,1", "--batch").error().message, "--batch: 1 is listed twice");
}

TEST(SweepParse, BadRequests) {
    auto zero = sweep(gpt2({1, 0}, {512}, false));
    ASSERT_FALSE(zero.ok());
    EXPECT_EQ(zero.error().field, "batch");
    EXPECT_EQ(zero.error().message, "--batch: \"0\" is not a positive integer");

    auto dup = sweep(gpt2({1}, {512, 512}, false));
    ASSERT_FALSE(dup.ok());
    EXPECT_EQ(dup.error().field, "seq");

    // The failing point is named.
    auto huge = sweep(gpt2({1, 1000000000000000}, {512}, false));
    ASSERT_FALSE(huge.ok());
    EXPECT_NE(huge.error().message.find("batch 1000000000000000, seq 512: "), std::string::npos) << huge.error().message;

    SweepRequest missing;
    missing.batches = {1};
    EXPECT_FALSE(sweep(missing).ok());
    missing.base.model = "no-such-model";
    EXPECT_FALSE(sweep(missing).ok());
}

TEST(SweepFitTest, PolynomialFitRecoversCoefficients) {
    std::vector<double> x{512, 1024, 2048, 4096}, y;
    for (double v : x) y.push_back(0.00123 * v * v + 0.6039 * v + 437.9);
    const PolyFit q = fit_polynomial(x, y, 2);
    ASSERT_EQ(q.coef.size(), 3u);
    EXPECT_NEAR(q.coef[0], 0.00123, 1e-9);
    EXPECT_NEAR(q.coef[1], 0.6039, 1e-6);
    EXPECT_NEAR(q.coef[2], 437.9, 1e-4);
    EXPECT_NEAR(q.r2, 1.0, 1e-12);
    EXPECT_EQ(format_fit(q), "0.00123·x² + 0.6039·x + 437.9 MB");
    EXPECT_EQ(format_fit(PolyFit{{2.5, -12.25}, 1.0}), "2.5·x - 12.25 MB");
    EXPECT_EQ(format_fit(PolyFit{{-1.0, 123456.7}, 1.0}), "-1·x + 123457 MB");
    // Too few distinct x values: no fit.
    EXPECT_TRUE(fit_polynomial({1, 1, 2}, {1, 2, 3}, 2).coef.empty());
    EXPECT_EQ(fit_polynomial({1, 2}, {3, 5}, 1).coef.size(), 2u);
}

TEST(SweepTest, OrderIsSeqOuterBatchInner) {
    const SweepResult r = run(gpt2({2, 1}, {256, 128}, false));
    ASSERT_EQ(r.points.size(), 4u);
    const std::vector<std::pair<std::int64_t, std::int64_t>> want{{2, 256}, {1, 256}, {2, 128}, {1, 128}};
    for (std::size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(r.points[i].batch, want[i].first);
        EXPECT_EQ(r.points[i].seq, want[i].second);
    }
    EXPECT_FALSE(r.fit.has_value());  // both axes vary
    EXPECT_EQ(r.seqs, (std::vector<std::int64_t>{256, 128}));
    EXPECT_EQ(r.model_name, "gpt2");
    for (const auto& p : r.points) {
        Bytes sum;
        for (auto b : sweep_stack(p)) sum += b;
        EXPECT_EQ(sum, p.per_gpu.total_device);
    }
}

TEST(SweepTest, BatchSweepIsLinear) {
    // Saved activations grow by exactly one sample's worth per unit of
    // batch, measured from two independent estimate() calls at batch 1 and 2.
    EstimateRequest one;
    one.model = "gpt2";
    one.seq = 512;
    EstimateRequest two = one;
    two.batch = 2;
    const EstimateResult e1 = estimate(one).value(), e2 = estimate(two).value();
    const Bytes per_sample = e2.per_gpu.activations - e1.per_gpu.activations;
    ASSERT_GT(per_sample, Bytes(0));

    const SweepResult r = run(gpt2({1, 2, 4, 8}, {512}, false));
    ASSERT_EQ(r.points.size(), 4u);
    EXPECT_FALSE(r.simulated);
    for (const auto& p : r.points)
        EXPECT_EQ(p.per_gpu.activations - r.points[0].per_gpu.activations, per_sample * (p.batch - 1)) << p.batch;
    // Analytic peaks are the same as estimate()'s.
    EXPECT_EQ(r.points[0].per_gpu.total_device, e1.per_gpu.total_device);
    EXPECT_EQ(r.points[1].per_gpu.total_device, e2.per_gpu.total_device);

    ASSERT_TRUE(r.fit.has_value());
    EXPECT_EQ(r.fit->axis, "batch");
    EXPECT_EQ(r.fit->fixed, 512);
    EXPECT_FALSE(r.fit->quadratic_chosen) << r.fit->quadratic_share;
    EXPECT_EQ(r.fit->formula, format_fit(r.fit->linear));
    // gpt2 at batch 1 peaks in the optimizer step (weights + grads + Adam
    // states + foreach temporaries), which does not grow with batch; from
    // batch 2 on the peak is in the backward pass. The fit covers that regime.
    EXPECT_EQ(e1.per_gpu.peak_phase, "optimizer");
    EXPECT_EQ(r.fit->peak_phase, "backward");
    EXPECT_EQ(r.fit->excluded, (std::vector<std::int64_t>{1}));
    EXPECT_NE(r.fit->note.find("batch 1 peaks in another phase"), std::string::npos) << r.fit->note;
    // There the total is exactly linear: the slope is the per-sample
    // difference of the total between two independent estimates...
    const double slope_mb = (total_at(3, 512) - total_at(2, 512)).mib();
    EXPECT_NEAR(r.fit->linear.coef[0], slope_mb, 1e-9 * slope_mb);
    EXPECT_NEAR(r.fit->linear(2), e2.per_gpu.total_device.mib(), 1e-6);
    EXPECT_NEAR(r.fit->linear.r2, 1.0, 1e-12);
    // ...of which the saved activations are the largest part (the rest:
    // activation gradients in flight, the fp32 logits, allocator slack).
    EXPECT_GT(per_sample.mib(), 0.5 * slope_mb);
    EXPECT_LT(per_sample.mib(), slope_mb);
}

TEST(SweepTest, SimulatedBatchSweep) {
    const SweepResult r = run(gpt2({1, 2, 4, 8}, {512}, true));
    EXPECT_TRUE(r.simulated);
    ASSERT_EQ(r.points.size(), 4u);
    for (std::size_t i = 1; i < r.points.size(); ++i)
        EXPECT_GT(r.points[i].per_gpu.total_device, r.points[i - 1].per_gpu.total_device);
    ASSERT_TRUE(r.fit.has_value());
    EXPECT_FALSE(r.fit->quadratic_chosen);
    EXPECT_GT(r.fit->linear.coef[0], 0);
}

TEST(SweepTest, EagerAttentionIsQuadraticInSeq) {
    for (bool simulate : {false, true}) {
        const SweepResult r = run(gpt2({8}, {128, 256, 512, 1024}, simulate, Attention::Eager));
        ASSERT_TRUE(r.fit.has_value());
        EXPECT_EQ(r.fit->axis, "seq");
        EXPECT_EQ(r.fit->fixed, 8);
        EXPECT_TRUE(r.fit->excluded.empty());
        EXPECT_TRUE(r.fit->quadratic_chosen) << simulate << " " << r.fit->formula << " share " << r.fit->quadratic_share;
        ASSERT_TRUE(r.fit->quadratic.has_value());
        EXPECT_GT(r.fit->quadratic->coef[0], 0);
        EXPECT_NE(r.fit->formula.find("·x²"), std::string::npos);
    }
}

TEST(SweepTest, FlashAttentionIsLinearInSeq) {
    for (bool simulate : {false, true}) {
        const SweepResult r = run(gpt2({8}, {128, 256, 512, 1024}, simulate, Attention::Flash));
        ASSERT_TRUE(r.fit.has_value());
        EXPECT_TRUE(r.fit->excluded.empty());
        EXPECT_FALSE(r.fit->quadratic_chosen) << simulate << " " << format_fit(*r.fit->quadratic) << " share " << r.fit->quadratic_share;
        EXPECT_EQ(r.fit->formula.find("x²"), std::string::npos);
    }
}

TEST(SweepTest, BertSeqAndBatch) {
    // Seed 000's BERT: quadratic in sequence length with eager attention,
    // linear in batch, linear with flash.
    SweepRequest r;
    r.base.model = "bert-base-uncased";
    r.base.attention = Attention::Eager;
    r.batches = {32};  // large enough for the backward pass to peak at every length
    r.seqs = {64, 128, 256, 512};
    SweepResult eager = run(r);
    ASSERT_TRUE(eager.fit.has_value());
    EXPECT_TRUE(eager.fit->excluded.empty());
    EXPECT_TRUE(eager.fit->quadratic_chosen) << eager.fit->formula;
    EXPECT_GT(eager.fit->quadratic->coef[0], 0);
    r.base.attention = Attention::Flash;
    SweepResult flash = run(r);
    ASSERT_TRUE(flash.fit.has_value());
    EXPECT_FALSE(flash.fit->quadratic_chosen) << flash.fit->formula;
    r.base.attention = Attention::Eager;
    r.batches = {4, 8, 16, 32};
    r.seqs = {512};
    SweepResult batch = run(r);
    ASSERT_TRUE(batch.fit.has_value());
    EXPECT_FALSE(batch.fit->quadratic_chosen) << batch.fit->formula;
}

TEST(SweepTest, InferenceStacksTheKvCache) {
    SweepRequest r = gpt2({1, 4, 16}, {256}, true);
    r.base.mode = Mode::Infer;
    r.base.gen_len = 256;
    const SweepResult s = run(r);
    for (const auto& p : s.points) {
        EXPECT_GT(p.per_gpu.kv_cache, Bytes(0));
        EXPECT_EQ(p.per_gpu.gradients, Bytes(0));
        Bytes sum;
        for (auto b : sweep_stack(p)) sum += b;
        EXPECT_EQ(sum, p.per_gpu.total_device);
    }
    EXPECT_GT(sweep_stack(s.points.back())[4], Bytes(0));
    EXPECT_NE(render_sweep_svg(s, "t", GiB(2)).find(">KV cache<"), std::string::npos);
}

TEST(SweepTest, TenPointAnalyticSweep) {
    const SweepResult r = run(gpt2({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {256}, false));
    EXPECT_EQ(r.points.size(), 10u);
}

TEST(SweepRender, TablesAndJson) {
    const SweepResult r = run(gpt2({2, 4, 8}, {512}, false));
    const std::string text = render_sweep(r, Format::Text);
    EXPECT_NE(text.find("peak allocated"), std::string::npos);
    EXPECT_NE(text.find("fit vs batch size"), std::string::npos);
    EXPECT_NE(text.find("linear:"), std::string::npos);
    const std::string md = render_sweep(r, Format::Markdown);
    EXPECT_NE(md.find("| batch |"), std::string::npos);
    const std::string csv = render_sweep(r, Format::Csv);
    EXPECT_EQ(count(csv, "\n"), 4u);
    EXPECT_EQ(csv.rfind("batch,seq,weights_bytes,", 0), 0u);
    EXPECT_NE(csv.find("\n2,512," + std::to_string(r.points[0].per_gpu.weights.count()) + ","), std::string::npos);

    const auto j = nlohmann::json::parse(render_sweep(r, Format::Json));
    ASSERT_EQ(j["points"].size(), 3u);
    EXPECT_TRUE(j["points"][0]["total_device"].is_number_integer());
    EXPECT_EQ(j["points"][2]["batch"], 8);
    EXPECT_EQ(j["points"][2]["total_device"].get<std::int64_t>(), r.points[2].per_gpu.total_device.count());
    EXPECT_EQ(j["fit"]["axis"], "batch");
    EXPECT_EQ(j["fit"]["chosen"], "linear");
    EXPECT_EQ(j["fit"]["linear"]["coef"].size(), 2u);
    EXPECT_EQ(j["fit"]["quadratic"]["coef"].size(), 3u);
    EXPECT_TRUE(sweep_to_json(run(gpt2({1, 2}, {128, 256}, false)))["fit"].is_null());
}

TEST(SweepRender, SvgOneAxis) {
    const SweepResult r = run(gpt2({1, 2, 4, 8}, {512}, true));
    const std::string svg = render_sweep_svg(r, "gpt2 batch sweep", GiB(12));
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
    EXPECT_TRUE(balanced_tags(svg));
    EXPECT_NE(svg.find("memory per GPU (GiB)"), std::string::npos);
    EXPECT_NE(svg.find("batch size (sequences per GPU), seq 512"), std::string::npos);
    EXPECT_NE(svg.find(" GiB</text>"), std::string::npos);
    for (const char* legend : {">weights<", ">gradients<", ">optimizer states<", ">activations<", ">GPU capacity<", ">fit<"})
        EXPECT_NE(svg.find(legend), std::string::npos) << legend;
    EXPECT_NE(svg.find("other (transients"), std::string::npos);
    EXPECT_EQ(count(svg, "class=\"capacity\""), 1u);
    EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
    EXPECT_EQ(count(svg, "class=\"fit\""), 1u);
    EXPECT_NE(svg.find(r.fit->formula), std::string::npos);
    std::size_t segments = 0;
    for (const auto& p : r.points)
        for (auto b : sweep_stack(p)) segments += b > Bytes(0) ? 1 : 0;
    EXPECT_EQ(count(svg, "<rect class=\"seg\""), segments);
    EXPECT_GE(segments, 4u * 4u);

    // Capacity far above the bars: a note instead of a flattened plot.
    const std::string far = render_sweep_svg(r, "t", GiB(80));
    EXPECT_EQ(count(far, "class=\"capacity\""), 0u);
    EXPECT_NE(far.find("above the top of the plot"), std::string::npos);
}

TEST(SweepRender, SvgGrouped) {
    const SweepResult r = run(gpt2({1, 2, 4}, {256, 512, 1024}, false));
    const std::string svg = render_sweep_svg(r, "gpt2 <grid> & more", GiB(16));
    EXPECT_TRUE(balanced_tags(svg));
    EXPECT_NE(svg.find("gpt2 &lt;grid&gt; &amp; more"), std::string::npos);
    for (const char* g : {">seq 256<", ">seq 512<", ">seq 1024<"}) EXPECT_NE(svg.find(g), std::string::npos) << g;
    EXPECT_NE(svg.find("grouped by sequence length"), std::string::npos);
    EXPECT_EQ(count(svg, "class=\"fit\""), 0u);
    std::size_t segments = 0;
    for (const auto& p : r.points)
        for (auto b : sweep_stack(p)) segments += b > Bytes(0) ? 1 : 0;
    EXPECT_EQ(count(svg, "<rect class=\"seg\""), segments);
}

}  // namespace
}  // namespace gpumem
