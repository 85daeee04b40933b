// Tests of the GPU catalog lookup (find_gpu): exact names and aliases resolve,
// a family name with several capacities ("A100", "V100") is an error that
// lists them instead of silently picking one.
#include <gtest/gtest.h>

#include <string>

#include "gpumem/memory/gpu_catalog.hpp"
#include "test_util.hpp"

using namespace gpumem;

namespace {

// Capacities as CUDA reports them where public OOM messages / logs name the GPU
// (gpu_catalog.cpp lists the sources): A100 40GB "total capacity of 39.50 GiB"
// (TianheWu/CoSeR #10), A100 80GB "79.25 GiB" (levihsu/OOTDiffusion #235),
// H100 80GB HBM3 "79.18GiB" (a torchtitan start-up log); otherwise the
// datasheet's: V100 Tensor Core GPU datasheet ("GPU Memory: 32 GB / 16 GB HBM2").
TEST(GpuCatalog, ExactNamesResolveCaseInsensitively) {
    const struct {
        const char* query;
        const char* name;
        Bytes memory;
    } cases[] = {
        {"A100-40GB", "A100-40GB", MiB(40448)}, {"a100-40gb", "A100-40GB", MiB(40448)}, {"A100-80GB", "A100-80GB", MiB(81152)},
        {"a100-80GB", "A100-80GB", MiB(81152)}, {"V100-16GB", "V100-16GB", GiB(16)}, {"v100-32gb", "V100-32GB", GiB(32)},
        {"H100-80GB", "H100-80GB", MiB(81080)}, {"h100-80gb", "H100-80GB", MiB(81080)},
    };
    for (const auto& c : cases) {
        const auto g = find_gpu(c.query);
        ASSERT_TRUE(g.ok()) << c.query << ": " << g.error().message;
        EXPECT_EQ(g->name, c.name) << c.query;
        EXPECT_EQ(g->memory, c.memory) << c.query;
    }
}

TEST(GpuCatalog, UnambiguousShortNamesAndAliasesStillResolve) {
    // One catalog entry per family: the short name is not ambiguous.
    for (const auto& [query, name] : std::initializer_list<std::pair<const char*, const char*>>{
             {"H100", "H100-80GB"}, {"h100-sxm", "H100-80GB"}, {"L4", "L4-24GB"}, {"H200", "H200-141GB"},
             {"a10g", "A10G-24GB"}, {"T4", "T4-16GB"}, {"Tesla V100-SXM2 16GB", "V100-16GB"}, {"4090", "RTX-4090"},
             {"a100-40", "A100-40GB"}, {"A100 80GB", "A100-80GB"}}) {
        const auto g = find_gpu(query);
        ASSERT_TRUE(g.ok()) << query << ": " << g.error().message;
        EXPECT_EQ(g->name, name) << query;
    }
}

TEST(GpuCatalog, AmbiguousFamilyListsTheCandidates) {
    const auto a = find_gpu("A100");
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().code, ErrorCode::InvalidArgument);
    EXPECT_EQ(a.error().field, "gpu");
    EXPECT_NE(a.error().message.find("--gpu A100 is ambiguous: A100-40GB or A100-80GB; name one"), std::string::npos)
        << a.error().message;

    const auto lower = find_gpu("a100");
    ASSERT_FALSE(lower.ok());
    EXPECT_NE(lower.error().message.find("ambiguous: A100-40GB or A100-80GB"), std::string::npos);

    const auto v = find_gpu("V100");
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.error().code, ErrorCode::InvalidArgument);
    EXPECT_NE(v.error().message.find("--gpu V100 is ambiguous: V100-16GB or V100-32GB; name one"), std::string::npos)
        << v.error().message;

    // Unknown names are still NotFound with the catalog listed.
    const auto z = find_gpu("Z100");
    ASSERT_FALSE(z.ok());
    EXPECT_EQ(z.error().code, ErrorCode::NotFound);
    EXPECT_NE(z.error().message.find("known: A100-40GB"), std::string::npos) << z.error().message;
}

TEST(GpuCatalog, NoFamilyNameIsAnAliasOfOneMember) {
    // Every family with several capacities must be ambiguous, not an alias.
    for (const auto& g : gpu_catalog()) {
        int members = 0;
        for (const auto& o : gpu_catalog()) members += gpu_family(o.name) == gpu_family(g.name) ? 1 : 0;
        const auto r = find_gpu(gpu_family(g.name));
        if (members > 1) {
            EXPECT_FALSE(r.ok()) << gpu_family(g.name) << " resolves to " << (r.ok() ? r->name : "");
        } else {
            ASSERT_TRUE(r.ok()) << gpu_family(g.name) << ": " << r.error().message;
            EXPECT_EQ(r->name, g.name);
        }
    }
    EXPECT_EQ(gpu_family("A100-40GB"), "A100");
    EXPECT_EQ(gpu_family("H200-141GB"), "H200");
    EXPECT_EQ(gpu_family("GB200-NVL72"), "GB200-NVL72");
    EXPECT_EQ(gpu_family("RTX-4090"), "RTX-4090");
    EXPECT_EQ(gpu_family("MI300X"), "MI300X");
}

TEST(GpuCatalog, CliRejectsAmbiguousGpu) {
    const auto r = test::run_cli("estimate gpt2 --gpu A100");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--gpu A100 is ambiguous: A100-40GB or A100-80GB"), std::string::npos) << r.err;
    const auto ok = test::run_cli("estimate gpt2 --gpu A100-40GB --format json");
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

}  // namespace
