#include "gpumem/memory/gpu_catalog.hpp"

#include <algorithm>
#include <cctype>

namespace gpumem {

namespace {
constexpr std::int64_t kGB = 1000LL * 1000 * 1000;
// cuBLAS default workspace: ":4096:2:16:8" = 2 x 4 MiB + 8 x 16 KiB before
// Hopper; PyTorch >= 2.3 uses ":4096:8" (32 MiB) on compute capability >= 9.0
// (aten/src/ATen/cuda/CublasHandlePool.cpp, getChosenWorkspaceSize).
const Bytes kCublasPreHopper{8519680};
const Bytes kCublasHopper = MiB(32);
// CUDA context + kernel images with lazy module loading (CUDA >= 11.7,
// PyTorch >= 2.0): a few hundred MiB; eager loading on older stacks measured
// 1.3-1.6 GiB (seed 001: 1351 MiB V100/CUDA 10.2, 1639 MiB RTX 3090/CUDA 11.4;
// HF model_memory_anatomy: 1343 MiB V100/CUDA 11.2).
const Bytes kContextLazy = MiB(512);

GpuSpec gpu(std::string name, std::vector<std::string> aliases, std::string vendor, std::string arch, int cc,
            Bytes mem, double bw, double fp32, double tf32, double fp16, double bf16, double fp8, double int8) {
    GpuSpec g;
    g.name = std::move(name);
    g.aliases = std::move(aliases);
    g.vendor = std::move(vendor);
    g.arch = std::move(arch);
    g.compute_capability = cc;
    g.memory = mem;
    g.bandwidth_gbs = bw;
    g.tflops_fp32 = fp32;
    g.tflops_tf32 = tf32;
    g.tflops_fp16 = fp16;
    g.tflops_bf16 = bf16;
    g.tflops_fp8 = fp8;
    g.tflops_int8 = int8;
    g.cuda_context = kContextLazy;
    // Eager loading maps every kernel image at context creation: measured
    // 1351 MiB on a V100 (CUDA 10.2) and 1639 MiB on an RTX 3090 (CUDA 11.4)
    // in seed 001, 1343 MiB on a V100 (CUDA 11.2) in HF's model_memory_anatomy;
    // newer architectures carry more kernel images, so they take the larger value.
    g.cuda_context_eager = (arch == "volta" || arch == "turing") ? MiB(1351) : MiB(1639);
    g.cublas_workspace = cc >= 90 ? kCublasHopper : kCublasPreHopper;
    g.gpus_per_node = g.name.rfind("GB200-NVL72", 0) == 0 ? 72 : 8;
    return g;
}

std::string canon(std::string_view s) {
    std::string out;
    for (char c : s)
        if (std::isalnum(static_cast<unsigned char>(c))) out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    return out;
}
}  // namespace

const std::vector<GpuSpec>& gpu_catalog() {
    // Dense (non-sparse) peak TFLOP/s from the vendors' datasheets; SXM parts
    // where both SXM and PCIe exist.
    // Capacity is what CUDA reports as the device's total memory
    // (cudaMemGetInfo; torch.cuda.get_device_properties().total_memory, the
    // "total capacity" of PyTorch's OOM message), which is below the
    // datasheet's size by what the driver reserves (nvidia-smi -q "Reserved"),
    // where public OOM messages or logs show it; otherwise the datasheet's size.
    // The figure moves by ~0.1 GiB between driver versions: the lowest seen is
    // kept, so that "fits" errs on the safe side. Sources, each naming the GPU:
    //   A100-40GB 39.50 GiB: TianheWu/CoSeR issue #10 (2025-01; 39.59 GiB in
    //     raoyongming/DenseCLIP issue #52, 2024-02);
    //   A100-80GB 79.25 GiB: levihsu/OOTDiffusion issue #235 (2025-03),
    //     wbfwonderful/Vad-R1 issue #11 (2026-03, "4 A100 80GB");
    //   H100-80GB 79.18 GiB: torchtitan's start-up line "CUDA capacity: NVIDIA
    //     H100 80GB HBM3 with 79.18GiB memory" (torchtitan components/metrics.py
    //     DeviceMemoryMonitor: total_memory) in a public run log (2026-01);
    //   RTX-4090 23.64 GiB: ali-vilab/VGen issue #104 (2024-04),
    //     3DTopia/Phidias-Diffusion issue #8 (2025-08);
    //   H200-141GB 139.80 GiB: vLLM's "total_gpu_memory=139.80GiB" on an H200
    //     141GB (tests/fixtures/groundtruth/vllm_v0_logs.json
    //     h200-tinyllama-rho-1b-v064) and "GPU 5 has a total capacity of
    //     139.80 GiB" in a public 8xH200 fine-tuning report (2025).
    static const std::vector<GpuSpec> kCatalog = {
        gpu("A100-40GB", {"a100-40gb", "a10040gb", "a100-40", "a100 40gb"}, "NVIDIA", "ampere", 80, MiB(40448), 1555, 19.5, 156, 312, 312, 0, 624),
        // No bare "a100" / "v100" alias: the name alone does not say which
        // capacity (find_gpu answers that it is ambiguous).
        gpu("A100-80GB", {"a100-80gb", "a10080gb", "a100-80"}, "NVIDIA", "ampere", 80, MiB(81152), 2039, 19.5, 156, 312, 312, 0, 624),
        gpu("H100-80GB", {"h100", "h100-80gb", "h100-sxm", "h10080gb"}, "NVIDIA", "hopper", 90, MiB(81080), 3350, 67, 494.7, 989.4, 989.4, 1978.9, 1978.9),
        gpu("H200-141GB", {"h200", "h200-141gb"}, "NVIDIA", "hopper", 90, MiB(143155), 4800, 67, 494.7, 989.4, 989.4, 1978.9, 1978.9),
        gpu("B200-180GB", {"b200", "b200-180gb"}, "NVIDIA", "blackwell", 100, Bytes(180 * kGB), 8000, 75, 1100, 2250, 2250, 4500, 4500),
        // GB200 NVL72 (NVIDIA GB200 NVL72 datasheet): 72 Blackwell GPUs in one
        // NVLink domain, 13.4 TB HBM3e in all (186 GB per GPU), 8 TB/s per GPU,
        // dense BF16 2.5 PFLOP/s and FP8 5 PFLOP/s per GPU (the datasheet's
        // sparse figures halved).
        gpu("GB200-NVL72", {"gb200", "gb200-nvl72", "gb200nvl72"}, "NVIDIA", "blackwell", 100, Bytes(186 * kGB), 8000, 80, 1250, 2500, 2500, 5000, 5000),
        gpu("L4-24GB", {"l4", "l4-24gb"}, "NVIDIA", "ada", 89, Bytes(24 * kGB), 300, 30.3, 60, 121, 121, 242.5, 242.5),
        gpu("L40S-48GB", {"l40s", "l40s-48gb"}, "NVIDIA", "ada", 89, Bytes(48 * kGB), 864, 91.6, 183, 362.05, 362.05, 733, 733),
        gpu("A10G-24GB", {"a10g", "a10g-24gb", "a10"}, "NVIDIA", "ampere", 86, Bytes(24 * kGB), 600, 31.2, 62.5, 125, 125, 0, 250),
        gpu("T4-16GB", {"t4", "t4-16gb"}, "NVIDIA", "turing", 75, Bytes(16 * kGB), 320, 8.1, 0, 65, 0, 0, 130),
        gpu("V100-16GB", {"v100-16gb", "v100-sxm2-16gb", "teslav100sxm216gb"}, "NVIDIA", "volta", 70, GiB(16), 900, 15.7, 0, 125, 0, 0, 0),
        gpu("V100-32GB", {"v100-32gb", "v100-sxm2-32gb"}, "NVIDIA", "volta", 70, GiB(32), 900, 15.7, 0, 125, 0, 0, 0),
        gpu("RTX-3090", {"rtx3090", "rtx-3090", "3090"}, "NVIDIA", "ampere", 86, GiB(24), 936, 35.6, 35.6, 71, 71, 0, 284),
        gpu("RTX-4090", {"rtx4090", "rtx-4090", "4090"}, "NVIDIA", "ada", 89, MiB(24207), 1008, 82.6, 82.6, 165.2, 165.2, 330.3, 660.6),
        gpu("MI300X", {"mi300x", "mi300x-192gb"}, "AMD", "cdna3", 0, Bytes(192 * kGB), 5300, 163.4, 653.7, 1307.4, 1307.4, 2614.9, 2614.9),
    };
    return kCatalog;
}

namespace {
// The catalog's names, aliases and family names in canonical form, built once
// (a lookup per estimate then canonicalizes only the name asked for).
struct CatalogIndex {
    std::vector<std::pair<std::string, std::size_t>> names;  // catalog order: each entry's name, then its aliases
    std::vector<std::string> families;                       // per entry
};

const CatalogIndex& catalog_index() {
    static const CatalogIndex kIndex = [] {
        CatalogIndex ix;
        const auto& cat = gpu_catalog();
        for (std::size_t i = 0; i < cat.size(); ++i) {
            ix.names.emplace_back(canon(cat[i].name), i);
            for (const auto& a : cat[i].aliases) ix.names.emplace_back(canon(a), i);
            ix.families.push_back(canon(gpu_family(cat[i].name)));
        }
        return ix;
    }();
    return kIndex;
}
}  // namespace

Result<GpuSpec> find_gpu(std::string_view name) {
    const std::string key = canon(name);
    const CatalogIndex& ix = catalog_index();
    // 1. A catalog name or one of its aliases, case- and punctuation-insensitive.
    for (const auto& [n, i] : ix.names)
        if (n == key) return gpu_catalog()[i];
    // 2. A family name ("A100", "V100", "L4"): the catalog name without its
    //    capacity suffix. One match resolves; several are ambiguous, because
    //    the capacity is what gpumem answers about.
    std::vector<const GpuSpec*> family;
    if (!key.empty())
        for (std::size_t i = 0; i < ix.families.size(); ++i)
            if (ix.families[i] == key) family.push_back(&gpu_catalog()[i]);
    if (family.size() == 1) return *family.front();
    if (family.size() > 1) {
        std::string names;
        for (std::size_t i = 0; i < family.size(); ++i)
            names += (i == 0 ? "" : (i + 1 == family.size() ? " or " : ", ")) + family[i]->name;
        return Error{ErrorCode::InvalidArgument,
                     "--gpu " + std::string(name) + " is ambiguous: " + names + "; name one (e.g. --gpu " +
                         family.back()->name + ")",
                     "gpu"};
    }
    std::string list;
    for (const auto& g : gpu_catalog()) list += (list.empty() ? "" : ", ") + g.name;
    return Error{ErrorCode::NotFound, "--gpu: unknown GPU \"" + std::string(name) + "\"; known: " + list +
                                          " (or give --gpu-memory for another card)", "gpu"};
}

std::string gpu_family(std::string_view catalog_name) {
    // "A100-40GB" -> "A100", "H200-141GB" -> "H200"; names without a
    // "-<digits>GB" tail ("GB200-NVL72", "RTX-4090", "MI300X") are their own family.
    const std::string n(catalog_name);
    const auto dash = n.rfind('-');
    if (dash == std::string::npos || dash == 0 || n.size() < dash + 4) return n;
    const std::string tail = n.substr(dash + 1);
    if (tail.size() < 3 || tail.compare(tail.size() - 2, 2, "GB") != 0) return n;
    for (std::size_t i = 0; i + 2 < tail.size(); ++i)
        if (!std::isdigit(static_cast<unsigned char>(tail[i]))) return n;
    return n.substr(0, dash);
}

}  // namespace gpumem
