//! GPU health of a worker, from the per-GPU stats its sidecar sends with each load sample
//! (NVML figures, see docs/gpu.md), and the rule that calls a GPU degraded.
//!
//! ```text
//! LoadSample.gpus --ingest--> Vec<GpuStatus> --RoutingCore::gpus--> Worker.gpus
//!                                                  Worker::gpu_degraded() --> Candidate.gpu_degraded
//! ```
//!
//! A GPU is degraded when its clocks are being cut by something other than the workload
//! itself (HW slowdown, HW or SW thermal slowdown, HW power brake; not the ordinary SW power
//! cap, which a busy GPU reaches in normal service), when the driver raised a critical XID
//! error for it in the last few minutes, or when it has had an uncorrected ECC error since
//! the driver loaded (the memory needs a reset or row remapping). No stats means healthy.

use serde::Serialize;

/// `nvmlClocksThrottleReasonHwSlowdown`: HW slowdown (thermal or power brake, external).
pub const THROTTLE_HW_SLOWDOWN: u64 = 0x8;
/// `nvmlClocksThrottleReasonSwThermalSlowdown`: the driver cuts clocks to cool the GPU.
pub const THROTTLE_SW_THERMAL: u64 = 0x20;
/// `nvmlClocksThrottleReasonHwThermalSlowdown`: the GPU is too hot.
pub const THROTTLE_HW_THERMAL: u64 = 0x40;
/// `nvmlClocksThrottleReasonHwPowerBrakeSlowdown`: the system asserted the power brake.
pub const THROTTLE_HW_POWER_BRAKE: u64 = 0x80;

/// Why a GPU counts as degraded; `as_str` is the label shown in `/debug/workers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuIssue {
    /// HW or SW thermal slowdown.
    ThermalSlowdown,
    /// HW power brake.
    PowerBrake,
    /// HW slowdown.
    HwSlowdown,
    /// A critical XID error within the sidecar's hold time.
    XidError,
    /// Uncorrected ECC errors since the driver loaded.
    UncorrectedEcc,
}

/// One GPU of a worker as its last load sample described it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuStatus {
    /// NVML index in the sidecar's view.
    pub index: u32,
    /// NVML UUID (may be empty).
    pub uuid: String,
    /// Utilisation, percent.
    pub utilization_percent: u32,
    /// Memory in use, bytes.
    pub memory_used_bytes: u64,
    /// Memory in total, bytes.
    pub memory_total_bytes: u64,
    /// Temperature, degrees Celsius.
    pub temperature_celsius: u32,
    /// Power draw, milliwatts.
    pub power_milliwatts: u32,
    /// SM clock, MHz.
    pub sm_clock_mhz: u32,
    /// NVML clocks-throttle-reason bits.
    pub throttle_reasons: u64,
    /// Uncorrected ECC errors since the driver loaded.
    pub ecc_uncorrected_errors: u64,
    /// Last critical XID within the sidecar's hold time (0: none).
    pub recent_xid: u32,
    /// Critical XID events since the sidecar started.
    pub xid_events: u64,
    /// Why it is degraded (empty: healthy), from [`GpuStatus::issues`].
    pub issues: Vec<GpuIssue>,
}

impl GpuStatus {
    /// Fills `issues` from the figures (call once the figures are set).
    pub fn classified(mut self) -> Self {
        self.issues = self.issues();
        self
    }

    /// Why this GPU is degraded, from its throttle bits, XID and ECC figures.
    pub fn issues(&self) -> Vec<GpuIssue> {
        let t = self.throttle_reasons;
        let mut out = Vec::new();
        if t & (THROTTLE_HW_THERMAL | THROTTLE_SW_THERMAL) != 0 {
            out.push(GpuIssue::ThermalSlowdown);
        }
        if t & THROTTLE_HW_POWER_BRAKE != 0 {
            out.push(GpuIssue::PowerBrake);
        }
        if t & THROTTLE_HW_SLOWDOWN != 0 {
            out.push(GpuIssue::HwSlowdown);
        }
        if self.recent_xid != 0 {
            out.push(GpuIssue::XidError);
        }
        if self.ecc_uncorrected_errors > 0 {
            out.push(GpuIssue::UncorrectedEcc);
        }
        out
    }

    /// True when any issue applies.
    pub fn degraded(&self) -> bool {
        !self.issues.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttles_from_outside_the_workload_xids_and_ecc_degrade_a_gpu() {
        let g = |f: fn(&mut GpuStatus)| {
            let mut s = GpuStatus::default();
            f(&mut s);
            s.classified().issues
        };
        assert!(g(|_| {}).is_empty());
        assert!(
            g(|s| s.throttle_reasons = 0x1 | 0x4).is_empty(),
            "idle, power cap"
        );
        assert_eq!(
            g(|s| s.throttle_reasons = THROTTLE_HW_THERMAL),
            [GpuIssue::ThermalSlowdown]
        );
        assert_eq!(
            g(|s| s.throttle_reasons = THROTTLE_HW_POWER_BRAKE | THROTTLE_HW_SLOWDOWN),
            [GpuIssue::PowerBrake, GpuIssue::HwSlowdown]
        );
        assert_eq!(g(|s| s.recent_xid = 79), [GpuIssue::XidError]);
        assert!(
            g(|s| s.xid_events = 3).is_empty(),
            "only a recent XID counts"
        );
        assert_eq!(
            g(|s| s.ecc_uncorrected_errors = 1),
            [GpuIssue::UncorrectedEcc]
        );
    }
}
