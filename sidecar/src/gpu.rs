//! GPU statistics for load samples: one [`GpuStats`] per GPU of the worker's engine, with the
//! clocks-throttle reasons, uncorrected ECC errors and recent critical XID errors the router
//! uses to mark a GPU degraded.
//!
//! ```text
//! NVML --GpuBackend--> GpuProbe::sample(now_ms) --> Vec<GpuStats> (LoadSample.gpus)
//!   devices() ---select(engine's device list)--^
//!   read(index) per selected device
//!   drain_xids() --> last XID per GPU, reported for XID_HOLD_MS
//! ```
//!
//! NVML sits behind [`GpuBackend`] so the selection and the XID memory are tested with a fake.
//! In a pod the sidecar has no GPU limit of its own: the operator gives it every GPU of the
//! node to look at and a file naming the engine container's GPUs (docs/gpu.md), which
//! [`DeviceFilter::File`] reads on every sample until the engine has written it.

use std::collections::HashMap;
use std::path::PathBuf;

use kvroute_proto::v1::GpuStats;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::event::EventSet;

/// How long a critical XID error keeps being reported (`GpuStats.recent_xid`) after the
/// driver raised it: long enough for every router to see it in a few samples, short enough
/// that a GPU which recovered (or an application fault that did not recur) stops counting.
pub const XID_HOLD_MS: u64 = 5 * 60 * 1000;

/// A device as NVML numbers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    /// NVML index (in the sidecar's view).
    pub index: u32,
    /// NVML UUID (`GPU-...`, `MIG-...`); empty when NVML did not give one.
    pub uuid: String,
}

/// One device's figures as NVML gave them; a figure NVML refused (not supported, no ECC)
/// stays `None` and is sent as 0.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuReading {
    /// GPU utilisation, percent.
    pub utilization_percent: Option<u32>,
    /// Framebuffer memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Framebuffer memory in total, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Die temperature, degrees Celsius.
    pub temperature_celsius: Option<u32>,
    /// Power draw, milliwatts.
    pub power_milliwatts: Option<u32>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// `nvmlClocksThrottleReason*` bits in force now.
    pub throttle_reasons: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded.
    pub ecc_uncorrected_errors: Option<u64>,
}

/// A critical XID error the driver raised on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XidEvent {
    /// UUID of the device.
    pub uuid: String,
    /// The XID code (e.g. 79: fallen off the bus, 48: double-bit ECC error).
    pub xid: u32,
}

/// Why NVML could not answer.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// An NVML call failed.
    #[error("NVML: {0}")]
    Nvml(#[from] nvml_wrapper::error::NvmlError),
}

/// What the probe needs from NVML.
pub trait GpuBackend: Send {
    /// Every device NVML shows the sidecar, in index order.
    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError>;
    /// Reads the device at `index`.
    fn read(&self, index: u32) -> Result<GpuReading, GpuError>;
    /// Critical XID errors raised since the last call (never blocks).
    fn drain_xids(&mut self) -> Vec<XidEvent>;
}

/// Which of NVML's devices the probe reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceFilter {
    /// Every device NVML shows (the sidecar sees exactly the engine's GPUs, e.g. outside
    /// Kubernetes).
    All,
    /// The devices named in this file, written by the engine container (docs/gpu.md);
    /// nothing while it is missing or empty.
    File(PathBuf),
}

/// The engine's devices, as its device list names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// Every device (`all`).
    All,
    /// UUIDs (`GPU-...`, `MIG-...`) or NVML indices.
    Devices(Vec<String>),
}

/// Parses a device list in `NVIDIA_VISIBLE_DEVICES` or `nvidia-smi --query-gpu=uuid` form:
/// UUIDs or indices separated by commas, spaces or newlines. `all` selects every device;
/// an empty list, `void` or `none` is no list (`None`: nothing to report yet).
pub fn parse_device_list(text: &str) -> Option<Wanted> {
    let items: Vec<&str> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .collect();
    match items.as_slice() {
        [] | ["void"] | ["none"] => None,
        items if items.contains(&"all") => Some(Wanted::All),
        items => Some(Wanted::Devices(
            items.iter().map(|s| (*s).to_string()).collect(),
        )),
    }
}

/// The devices of `devices` that `wanted` names (by UUID, or by index for a number), in
/// NVML order.
pub fn select(devices: &[GpuDevice], wanted: &Wanted) -> Vec<GpuDevice> {
    match wanted {
        Wanted::All => devices.to_vec(),
        Wanted::Devices(names) => devices
            .iter()
            .filter(|d| {
                names.iter().any(|n| {
                    (!d.uuid.is_empty() && n.eq_ignore_ascii_case(&d.uuid))
                        || n.parse::<u32>().is_ok_and(|i| i == d.index)
                })
            })
            .cloned()
            .collect(),
    }
}

/// The last XID seen on one device.
#[derive(Clone, Copy, Debug, Default)]
struct XidSeen {
    last: u32,
    at_ms: u64,
    total: u64,
}

/// Samples the engine's GPUs. Without NVML (no GPU, no library, `--no-gpu`) every sample is
/// empty.
pub struct GpuProbe {
    backend: Option<Box<dyn GpuBackend>>,
    filter: DeviceFilter,
    xids: HashMap<String, XidSeen>,
    waiting_logged: bool,
}

impl GpuProbe {
    /// Initialises NVML; logs once and carries on without GPU stats when that fails.
    pub fn init(filter: DeviceFilter) -> Self {
        match NvmlBackend::init() {
            Ok(backend) => Self::with_backend(Box::new(backend), filter),
            Err(error) => {
                tracing::info!(%error, "no GPU: NVML unavailable, load samples carry no GPU stats");
                Self::disabled()
            }
        }
    }

    /// A probe over any backend (NVML, or a fake in tests).
    pub fn with_backend(backend: Box<dyn GpuBackend>, filter: DeviceFilter) -> Self {
        GpuProbe {
            backend: Some(backend),
            filter,
            xids: HashMap::new(),
            waiting_logged: false,
        }
    }

    /// A probe that never reports (tests, or GPU stats disabled).
    pub fn disabled() -> Self {
        GpuProbe {
            backend: None,
            filter: DeviceFilter::All,
            xids: HashMap::new(),
            waiting_logged: false,
        }
    }

    /// Stats of every selected GPU at `now_ms` (Unix milliseconds), in NVML order. A device
    /// NVML cannot read is left out; an empty vector means no GPU stats.
    pub fn sample(&mut self, now_ms: u64) -> Vec<GpuStats> {
        let Some(backend) = self.backend.as_mut() else {
            return Vec::new();
        };
        for event in backend.drain_xids() {
            tracing::warn!(uuid = %event.uuid, xid = event.xid, "GPU critical XID error");
            let seen = self.xids.entry(event.uuid).or_default();
            seen.last = event.xid;
            seen.at_ms = now_ms;
            seen.total += 1;
        }
        let devices = match backend.devices() {
            Ok(d) => d,
            Err(error) => {
                tracing::debug!(%error, "NVML device list failed");
                return Vec::new();
            }
        };
        let chosen = match &self.filter {
            DeviceFilter::All => devices,
            DeviceFilter::File(path) => {
                match std::fs::read_to_string(path)
                    .ok()
                    .and_then(|t| parse_device_list(&t))
                {
                    Some(wanted) => {
                        self.waiting_logged = false;
                        select(&devices, &wanted)
                    }
                    None => {
                        if !self.waiting_logged {
                            self.waiting_logged = true;
                            tracing::info!(path = %path.display(), "engine GPU list not written yet; no GPU stats until it is");
                        }
                        Vec::new()
                    }
                }
            }
        };
        chosen
            .into_iter()
            .filter_map(|d| match backend.read(d.index) {
                Ok(r) => Some(stats(&d, &r, self.xids.get(&d.uuid), now_ms)),
                Err(error) => {
                    tracing::debug!(%error, index = d.index, "NVML read failed");
                    None
                }
            })
            .collect()
    }
}

/// The wire form of one reading.
fn stats(d: &GpuDevice, r: &GpuReading, xid: Option<&XidSeen>, now_ms: u64) -> GpuStats {
    let recent = xid.filter(|x| now_ms.saturating_sub(x.at_ms) <= XID_HOLD_MS);
    GpuStats {
        utilization_percent: r.utilization_percent.unwrap_or(0),
        memory_used_bytes: r.memory_used_bytes.unwrap_or(0),
        memory_total_bytes: r.memory_total_bytes.unwrap_or(0),
        temperature_celsius: r.temperature_celsius.unwrap_or(0),
        power_milliwatts: r.power_milliwatts.unwrap_or(0),
        sm_clock_mhz: r.sm_clock_mhz.unwrap_or(0),
        index: d.index,
        uuid: d.uuid.clone(),
        throttle_reasons: r.throttle_reasons.unwrap_or(0),
        ecc_uncorrected_errors: r.ecc_uncorrected_errors.unwrap_or(0),
        recent_xid: recent.map_or(0, |x| x.last),
        xid_events: xid.map_or(0, |x| x.total),
    }
}

/// NVML itself. The library handle lives for the whole process (leaked once) so the XID
/// event sets, which borrow it, can live in the same struct.
/// Simulated GPUs for workers without one (the mock engine in demos and the e2e tier:
/// `--mock-gpus N`): N healthy L40S-sized devices with steady figures, so GPU dashboards and
/// alerts can be exercised end to end. Never degraded: a simulated GPU must not steer routing.
#[derive(Clone, Debug)]
pub struct SimulatedGpus {
    count: u32,
}

impl SimulatedGpus {
    /// Framebuffer of each simulated device (an L40S: 48 GiB).
    pub const MEMORY_TOTAL_BYTES: u64 = 48 << 30;

    /// `count` simulated devices, indices 0..count, UUIDs `GPU-kvroute-mock-<i>`.
    pub fn new(count: u32) -> Self {
        SimulatedGpus { count }
    }
}

impl GpuBackend for SimulatedGpus {
    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError> {
        Ok((0..self.count)
            .map(|index| GpuDevice {
                index,
                uuid: format!("GPU-kvroute-mock-{index}"),
            })
            .collect())
    }

    fn read(&self, _index: u32) -> Result<GpuReading, GpuError> {
        // vLLM reserves most of the framebuffer for its KV cache at start (0.9 by default).
        Ok(GpuReading {
            utilization_percent: Some(35),
            memory_used_bytes: Some(Self::MEMORY_TOTAL_BYTES / 10 * 9),
            memory_total_bytes: Some(Self::MEMORY_TOTAL_BYTES),
            temperature_celsius: Some(45),
            power_milliwatts: Some(120_000),
            sm_clock_mhz: Some(2_490),
            throttle_reasons: Some(0),
            ecc_uncorrected_errors: Some(0),
        })
    }

    fn drain_xids(&mut self) -> Vec<XidEvent> {
        Vec::new()
    }
}

struct NvmlBackend {
    nvml: &'static Nvml,
    /// One event set per device that supports critical-XID events.
    xid_sets: Vec<EventSet<'static>>,
}

impl NvmlBackend {
    fn init() -> Result<Self, GpuError> {
        let nvml: &'static Nvml = Box::leak(Box::new(Nvml::init()?));
        let mut xid_sets = Vec::new();
        for index in 0..nvml.device_count()? {
            let registered = nvml.device_by_index(index).and_then(|device| {
                let set = nvml.create_event_set()?;
                device
                    .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                    .map_err(|e| e.error)
            });
            match registered {
                Ok(set) => xid_sets.push(set),
                Err(error) => tracing::info!(index, %error, "no XID events for this GPU"),
            }
        }
        Ok(NvmlBackend { nvml, xid_sets })
    }
}

impl GpuBackend for NvmlBackend {
    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError> {
        (0..self.nvml.device_count()?)
            .map(|index| {
                let uuid = self
                    .nvml
                    .device_by_index(index)
                    .and_then(|d| d.uuid())
                    .unwrap_or_default();
                Ok(GpuDevice { index, uuid })
            })
            .collect()
    }

    fn read(&self, index: u32) -> Result<GpuReading, GpuError> {
        let d = self.nvml.device_by_index(index)?;
        let memory = d.memory_info().ok();
        Ok(GpuReading {
            utilization_percent: d.utilization_rates().ok().map(|u| u.gpu),
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            temperature_celsius: d.temperature(TemperatureSensor::Gpu).ok(),
            power_milliwatts: d.power_usage().ok(),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            throttle_reasons: d.current_throttle_reasons().ok().map(|r| r.bits()),
            ecc_uncorrected_errors: d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok(),
        })
    }

    fn drain_xids(&mut self) -> Vec<XidEvent> {
        let mut out = Vec::new();
        for set in &self.xid_sets {
            // Bounded: a storm of events is drained over several samples.
            for _ in 0..64 {
                let Ok(event) = set.wait(0) else { break };
                let xid = match event.event_data {
                    Some(XidError::Value(v)) => u32::try_from(v).unwrap_or(u32::MAX),
                    Some(XidError::Unknown) => 999,
                    None => continue,
                };
                let uuid = event.device.uuid().unwrap_or_default();
                out.push(XidEvent { uuid, xid });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::*;

    /// NVML stand-in: fixed devices and readings, XIDs pushed by the test.
    struct FakeGpus {
        devices: Vec<(GpuDevice, GpuReading)>,
        xids: Arc<Mutex<Vec<XidEvent>>>,
    }

    impl GpuBackend for FakeGpus {
        fn devices(&self) -> Result<Vec<GpuDevice>, GpuError> {
            Ok(self.devices.iter().map(|(d, _)| d.clone()).collect())
        }
        fn read(&self, index: u32) -> Result<GpuReading, GpuError> {
            self.devices
                .iter()
                .find(|(d, _)| d.index == index)
                .map(|(_, r)| r.clone())
                .ok_or(GpuError::Nvml(nvml_wrapper::error::NvmlError::NotFound))
        }
        fn drain_xids(&mut self) -> Vec<XidEvent> {
            std::mem::take(&mut *self.xids.lock())
        }
    }

    fn uuid(i: u32) -> String {
        format!("GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd")
    }

    /// A node with four GPUs; GPU i runs at 10*i % utilisation and HW-thermal throttles
    /// when i is 3.
    fn node() -> (FakeGpus, Arc<Mutex<Vec<XidEvent>>>) {
        let xids = Arc::new(Mutex::new(Vec::new()));
        let devices = (0..4)
            .map(|i| {
                let reading = GpuReading {
                    utilization_percent: Some(10 * i),
                    memory_used_bytes: Some(u64::from(i) << 30),
                    memory_total_bytes: Some(48 << 30),
                    temperature_celsius: Some(40 + i),
                    power_milliwatts: Some(100_000 + i),
                    sm_clock_mhz: Some(2_000),
                    throttle_reasons: Some(if i == 3 { 0x40 } else { 0 }),
                    ecc_uncorrected_errors: None,
                };
                let device = GpuDevice {
                    index: i,
                    uuid: uuid(i),
                };
                (device, reading)
            })
            .collect();
        (
            FakeGpus {
                devices,
                xids: xids.clone(),
            },
            xids,
        )
    }

    #[test]
    fn device_lists_parse_like_the_nvidia_runtime_writes_them() {
        assert_eq!(parse_device_list(""), None);
        assert_eq!(parse_device_list(" void\n"), None);
        assert_eq!(parse_device_list("none"), None);
        assert_eq!(parse_device_list("all"), Some(Wanted::All));
        assert_eq!(
            parse_device_list("GPU-a,GPU-b\n"),
            Some(Wanted::Devices(vec!["GPU-a".into(), "GPU-b".into()]))
        );
        assert_eq!(
            parse_device_list("GPU-a\nGPU-b\n"),
            parse_device_list("GPU-a, GPU-b")
        );
    }

    #[test]
    fn reports_only_the_gpus_the_engine_file_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("uuids");
        let (fake, _) = node();
        let mut probe = GpuProbe::with_backend(Box::new(fake), DeviceFilter::File(path.clone()));
        assert!(probe.sample(0).is_empty(), "no file yet: nothing");
        std::fs::write(&path, format!("{}\n{}\n", uuid(3), uuid(1).to_uppercase())).unwrap();
        let s = probe.sample(1);
        let got: Vec<(u32, &str, u32)> = s
            .iter()
            .map(|g| (g.index, g.uuid.as_str(), g.utilization_percent))
            .collect();
        assert_eq!(
            got,
            vec![(1, uuid(1).as_str(), 10), (3, uuid(3).as_str(), 30)]
        );
        assert_eq!(s[1].throttle_reasons, 0x40);
        assert_eq!(
            (s[0].memory_used_bytes, s[0].memory_total_bytes),
            (1 << 30, 48 << 30)
        );
        assert_eq!(
            (s[0].temperature_celsius, s[0].power_milliwatts),
            (41, 100_001)
        );
        assert_eq!(s[0].ecc_uncorrected_errors, 0, "no ECC reported as 0");

        std::fs::write(&path, "2").unwrap();
        let by_index: Vec<u32> = probe.sample(2).iter().map(|g| g.index).collect();
        assert_eq!(by_index, vec![2], "indices select too");
    }

    #[test]
    fn without_a_file_every_gpu_is_reported_and_disabled_reports_none() {
        let (fake, _) = node();
        let mut probe = GpuProbe::with_backend(Box::new(fake), DeviceFilter::All);
        assert_eq!(probe.sample(0).len(), 4);
        assert!(GpuProbe::disabled().sample(0).is_empty());
    }

    #[test]
    fn a_critical_xid_is_reported_for_the_hold_time_and_counted_for_ever() {
        let (fake, xids) = node();
        let mut probe = GpuProbe::with_backend(Box::new(fake), DeviceFilter::All);
        xids.lock().push(XidEvent {
            uuid: uuid(2),
            xid: 79,
        });
        let at = 1_000_000;
        let s = probe.sample(at);
        assert_eq!((s[2].recent_xid, s[2].xid_events), (79, 1));
        assert_eq!(
            (s[1].recent_xid, s[1].xid_events),
            (0, 0),
            "other GPUs clean"
        );
        let s = probe.sample(at + XID_HOLD_MS);
        assert_eq!(s[2].recent_xid, 79, "still within the hold time");
        let s = probe.sample(at + XID_HOLD_MS + 1);
        assert_eq!((s[2].recent_xid, s[2].xid_events), (0, 1));
    }

    #[test]
    fn simulated_gpus_report_every_device_healthy() {
        let mut probe = GpuProbe::with_backend(Box::new(SimulatedGpus::new(2)), DeviceFilter::All);
        let stats = probe.sample(1_000);
        assert_eq!(stats.len(), 2);
        for (i, g) in stats.iter().enumerate() {
            assert_eq!(g.index, i as u32);
            assert_eq!(g.uuid, format!("GPU-kvroute-mock-{i}"));
            assert_eq!(g.memory_total_bytes, SimulatedGpus::MEMORY_TOTAL_BYTES);
            assert!(g.memory_used_bytes < g.memory_total_bytes);
            assert!(g.utilization_percent <= 100);
            assert_eq!(
                (g.throttle_reasons, g.ecc_uncorrected_errors, g.recent_xid),
                (0, 0, 0)
            );
        }
        assert!(
            GpuProbe::with_backend(Box::new(SimulatedGpus::new(0)), DeviceFilter::All)
                .sample(1_000)
                .is_empty()
        );
    }
}
