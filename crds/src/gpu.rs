//! GPU products kvroute knows how to schedule on. The value is what NVIDIA's GPU feature
//! discovery writes into the `nvidia.com/gpu.product` node label.
//!
//! The list is checked by the operator (an unknown product becomes a `Degraded` condition with
//! the list in the message) instead of a schema enum, so a typo shows a clear explanation in
//! `kubectl describe` rather than a bare 422, and new products need no CRD upgrade to be
//! allowed through `KNOWN_GPUS` in a later operator release.

/// Node label that GPU feature discovery sets to the product name.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Extended resource name of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The default product: kvroute's cost model is calibrated on L40S.
pub const DEFAULT_GPU_PRODUCT: &str = "NVIDIA-L40S";

/// Products accepted in `spec.gpu.product`, each with vLLM V1's default step budget there
/// (`--max-num-batched-tokens`, OpenAI server): 8,192 on GPUs of 70 GiB or more that are not
/// A100s, 2,048 on every other, the A100 80 GB included (vLLM `EngineArgs.get_batch_defaults`).
pub const KNOWN_GPUS: &[(&str, u32)] = &[
    ("NVIDIA-L40S", 2_048),
    ("NVIDIA-L40", 2_048),
    ("NVIDIA-L4", 2_048),
    ("NVIDIA-A10G", 2_048),
    ("NVIDIA-A100-SXM4-40GB", 2_048),
    ("NVIDIA-A100-SXM4-80GB", 2_048),
    ("NVIDIA-A100-PCIE-40GB", 2_048),
    ("NVIDIA-A100-80GB-PCIe", 2_048),
    ("NVIDIA-H100-80GB-HBM3", 8_192),
    ("NVIDIA-H100-PCIe", 8_192),
    ("NVIDIA-H100-NVL", 8_192),
    ("NVIDIA-H200", 8_192),
    ("NVIDIA-GH200-480GB", 8_192),
    ("NVIDIA-B200", 8_192),
    ("Tesla-T4", 2_048),
    ("Tesla-V100-SXM2-16GB", 2_048),
];

/// The names of [`KNOWN_GPUS`], in order.
pub fn known_gpu_products() -> impl Iterator<Item = &'static str> {
    KNOWN_GPUS.iter().map(|&(name, _)| name)
}

/// vLLM V1's default step budget on `product` (see [`KNOWN_GPUS`]); 2,048 for a product not
/// listed, vLLM's default below 70 GiB.
pub fn vllm_default_step_budget(product: &str) -> u32 {
    KNOWN_GPUS
        .iter()
        .find(|&&(name, _)| name == product)
        .map_or(2_048, |&(_, budget)| budget)
}

/// True when `product` is one of [`KNOWN_GPUS`] (exact match: node labels are exact).
pub fn is_known_product(product: &str) -> bool {
    known_gpu_products().any(|name| name == product)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_product_is_known_and_case_matters() {
        assert!(is_known_product(DEFAULT_GPU_PRODUCT));
        assert!(is_known_product("NVIDIA-H100-80GB-HBM3"));
        assert!(!is_known_product("nvidia-l40s"));
        assert!(!is_known_product(""));
    }
}
