//! GPU statistics from NVML. Without a GPU or the NVML library, reports "no GPU" once and
//! every sample is `None`.

use kvroute_proto::v1::GpuStats;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};

/// Reads the first GPU visible to the pod (one vLLM worker per GPU).
pub struct GpuProbe {
    nvml: Option<Nvml>,
}

impl GpuProbe {
    /// Initialises NVML; logs once and carries on when that fails.
    pub fn init() -> Self {
        match Nvml::init() {
            Ok(nvml) => GpuProbe { nvml: Some(nvml) },
            Err(error) => {
                tracing::info!(%error, "no GPU: NVML unavailable, load samples carry no GPU stats");
                GpuProbe { nvml: None }
            }
        }
    }

    /// A probe that never reports (tests, or GPU stats disabled).
    pub fn disabled() -> Self {
        GpuProbe { nvml: None }
    }

    /// The first GPU's utilisation, memory and temperature now; `None` when the probe is
    /// disabled or NVML fails.
    pub fn sample(&self) -> Option<GpuStats> {
        let device = self.nvml.as_ref()?.device_by_index(0).ok()?;
        let mut stats = GpuStats::default();
        if let Ok(u) = device.utilization_rates() {
            stats.utilization_percent = u.gpu;
        }
        if let Ok(m) = device.memory_info() {
            stats.memory_used_bytes = m.used;
            stats.memory_total_bytes = m.total;
        }
        if let Ok(t) = device.temperature(TemperatureSensor::Gpu) {
            stats.temperature_celsius = t;
        }
        if let Ok(p) = device.power_usage() {
            stats.power_milliwatts = p;
        }
        if let Ok(c) = device.clock_info(Clock::SM) {
            stats.sm_clock_mhz = c;
        }
        Some(stats)
    }
}
