// gpumem/memory/gpu_catalog.hpp — the built-in GPU catalog.
//
// Capacity, HBM bandwidth and dense peak throughput per dtype from the
// vendors' datasheets (NVIDIA A100/H100/H200/B200/L4/L40S/A10G/T4/V100 and
// GeForce RTX 3090/4090 datasheets, AMD Instinct MI300X datasheet); dense
// (no 2:4 sparsity) tensor-core numbers. The CUDA context is what nvidia-smi
// shows beyond the caching allocator's reserved memory; defaults assume
// PyTorch >= 2.0 with CUDA lazy module loading and are overridable
// (--cuda-context); see docs/assumptions.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/result.hpp"

namespace gpumem {

struct GpuSpec {
    std::string name;                  // canonical, e.g. "A100-80GB"
    std::vector<std::string> aliases;  // accepted spellings (lower-case)
    std::string vendor;
    std::string arch;                  // "volta", "ampere", "ada", "hopper", "blackwell", "cdna3"
    int compute_capability = 0;        // 70, 80, 86, 89, 90, 100 (0 for AMD)
    Bytes memory;                      // capacity CUDA reports (cudaMemGetInfo total; below the datasheet by the driver's reserve), else the datasheet's
    double bandwidth_gbs = 0;          // HBM/GDDR bandwidth, GB/s
    double tflops_fp32 = 0;            // non-tensor FP32
    double tflops_tf32 = 0;
    double tflops_fp16 = 0;            // dense tensor core
    double tflops_bf16 = 0;
    double tflops_fp8 = 0;             // 0: unsupported
    double tflops_int8 = 0;
    Bytes cuda_context;                // context + kernels outside the allocator, lazy module loading
    Bytes cuda_context_eager;          // the same with eager module loading (CUDA < 11.7 / PyTorch < 1.13)
    Bytes cublas_workspace;            // one cuBLAS workspace (per handle/stream)
    // GPUs that share one NVLink (or PCIe) domain in the usual system: 8 on
    // HGX/DGX boards and PCIe servers, 72 in a GB200 NVL72 rack. A job's GPUs
    // per node default to this (--gpus-per-node or --nodes override it).
    std::int64_t gpus_per_node = 8;
};

const std::vector<GpuSpec>& gpu_catalog();
// A catalog name or alias (case- and punctuation-insensitive), or a family
// name that matches one entry ("L4", "H100"). A family with several
// capacities ("A100": A100-40GB and A100-80GB; "V100") is an InvalidArgument
// error listing them; an unknown name is NotFound listing the catalog.
Result<GpuSpec> find_gpu(std::string_view name);
// The family of a catalog name: the name without a "-<N>GB" capacity suffix
// ("A100-40GB" -> "A100"); other names are returned unchanged.
std::string gpu_family(std::string_view catalog_name);

}  // namespace gpumem
