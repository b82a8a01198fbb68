//! GPU products kvroute knows how to schedule on. The value is what NVIDIA's GPU feature
//! discovery writes into the `nvidia.com/gpu.product` node label.
//!
//! The list is checked by the operator (an unknown product becomes a `Degraded` condition with
//! the list in the message) instead of a schema enum, so a typo shows a clear explanation in
//! `kubectl describe` rather than a bare 422, and new products need no CRD upgrade to be
//! allowed through `KNOWN_GPU_PRODUCTS` in a later operator release.

/// Node label that GPU feature discovery sets to the product name.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Extended resource name of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The default product: kvroute's cost model is calibrated on L40S.
pub const DEFAULT_GPU_PRODUCT: &str = "NVIDIA-L40S";

/// Products accepted in `spec.gpu.product`.
pub const KNOWN_GPU_PRODUCTS: &[&str] = &[
    "NVIDIA-L40S",
    "NVIDIA-L40",
    "NVIDIA-L4",
    "NVIDIA-A10G",
    "NVIDIA-A100-SXM4-40GB",
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-A100-PCIE-40GB",
    "NVIDIA-A100-80GB-PCIe",
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-H100-PCIe",
    "NVIDIA-H100-NVL",
    "NVIDIA-H200",
    "NVIDIA-GH200-480GB",
    "NVIDIA-B200",
    "Tesla-T4",
    "Tesla-V100-SXM2-16GB",
];

/// vLLM V1's default step budget (`--max-num-batched-tokens`, OpenAI server) on `product`:
/// 8,192 on GPUs of 70 GiB or more that are not A100s (H100, H200, GH200, B200), 2,048 on
/// every other, the A100 80 GB included (vLLM `EngineArgs.get_batch_defaults`).
pub fn vllm_default_step_budget(product: &str) -> u32 {
    const LARGE: &[&str] = &[
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-H100-PCIe",
        "NVIDIA-H100-NVL",
        "NVIDIA-H200",
        "NVIDIA-GH200-480GB",
        "NVIDIA-B200",
    ];
    if LARGE.contains(&product) {
        8_192
    } else {
        2_048
    }
}

/// True when `product` is one of [`KNOWN_GPU_PRODUCTS`] (exact match: node labels are exact).
pub fn is_known_product(product: &str) -> bool {
    KNOWN_GPU_PRODUCTS.contains(&product)
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
