//! Lets the sidecar's NVML see the engine container's GPUs (docs/gpu.md).
//!
//! ```text
//! engine (nvidia.com/gpu limit)                      sidecar (no GPU limit)
//!   sh -c 'nvidia-smi --query-gpu=uuid > devices      NVIDIA_VISIBLE_DEVICES=all,
//!          (or $NVIDIA_VISIBLE_DEVICES); exec vllm'   NVIDIA_DRIVER_CAPABILITIES=utility
//!            \--> emptyDir kvroute-gpu/devices ---->  --gpu-devices-file: report only those
//! ```
//!
//! The NVIDIA device plugin gives GPUs only to the container with the `nvidia.com/gpu`
//! limit. The sidecar asks the NVIDIA runtime for every GPU of the node (utility capability
//! only: NVML, no compute) and reports the ones the engine container wrote down at start.
//! NVML's process list cannot be used instead: the driver reports host PIDs, which a pod
//! does not see. Where the runtime ignores `NVIDIA_VISIBLE_DEVICES` on a container without a
//! GPU limit (a hardened node), the sidecar finds no NVML and reports no GPU stats; routing
//! is unaffected.

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, EnvVar, PodSpec, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{ENGINE_CONTAINER, SIDECAR_CONTAINER};

/// The emptyDir the engine writes its GPU list to.
pub const GPU_LIST_VOLUME: &str = "kvroute-gpu";
/// Where both containers mount it.
pub const GPU_LIST_DIR: &str = "/run/kvroute/gpu";
/// The engine's GPU list: one UUID (or index) per line.
pub const GPU_LIST_FILE: &str = "/run/kvroute/gpu/devices";

/// Runs before the engine: writes the UUIDs of the GPUs this container sees (from
/// `nvidia-smi`, or the device plugin's `NVIDIA_VISIBLE_DEVICES` when there is no
/// `nvidia-smi`), atomically, then execs the engine whatever happened.
pub const WRAPPER_SCRIPT: &str = "f=/run/kvroute/gpu/devices; \
u=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null) || u=\"${NVIDIA_VISIBLE_DEVICES:-}\"; \
printf '%s\\n' \"$u\" > \"$f.tmp\" && mv \"$f.tmp\" \"$f\"; \
exec \"$@\"";

/// `$0` of the wrapper shell (shows in `ps`).
const WRAPPER_NAME: &str = "kvroute-gpu-list";

/// Wires a GPU worker pod so the sidecar reports the engine's GPUs: wraps the engine's
/// command, gives the sidecar the runtime's view of every GPU and the list file, and adds
/// the shared volume. Containers are found by name; a pod without them is left alone.
pub fn expose_engine_gpus(pod: &mut PodSpec) {
    let mount = |read_only| VolumeMount {
        name: GPU_LIST_VOLUME.to_string(),
        mount_path: GPU_LIST_DIR.to_string(),
        read_only: Some(read_only),
        ..Default::default()
    };
    let env = |name: &str, value: &str| EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        ..Default::default()
    };
    for c in &mut pod.containers {
        if c.name == ENGINE_CONTAINER {
            let engine = c.command.take().unwrap_or_default();
            let mut command = vec![
                "/bin/sh".to_string(),
                "-c".to_string(),
                WRAPPER_SCRIPT.to_string(),
                WRAPPER_NAME.to_string(),
            ];
            command.extend(engine);
            c.command = Some(command);
            c.volume_mounts
                .get_or_insert_with(Vec::new)
                .push(mount(false));
        } else if c.name == SIDECAR_CONTAINER {
            let envs = c.env.get_or_insert_with(Vec::new);
            envs.push(env("NVIDIA_VISIBLE_DEVICES", "all"));
            envs.push(env("NVIDIA_DRIVER_CAPABILITIES", "utility"));
            envs.push(env("KVROUTE_SIDECAR_GPU_DEVICES_FILE", GPU_LIST_FILE));
            c.volume_mounts
                .get_or_insert_with(Vec::new)
                .push(mount(true));
        }
    }
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: GPU_LIST_VOLUME.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".to_string()),
            size_limit: Some(Quantity("1Mi".to_string())),
        }),
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use k8s_openapi::api::core::v1::Container;

    use super::*;

    fn pod() -> PodSpec {
        PodSpec {
            containers: vec![
                Container {
                    name: ENGINE_CONTAINER.into(),
                    command: Some(vec!["vllm".into(), "serve".into()]),
                    args: Some(vec!["m".into()]),
                    ..Default::default()
                },
                Container {
                    name: SIDECAR_CONTAINER.into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    /// Only vLLM workers get the wiring: the mock engine has no GPU to list.
    #[test]
    fn desired_deployment_wires_vllm_workers_only() {
        use super::super::deployment::desired_deployment;
        use super::super::fixtures::{cfg, ws};
        let pod = |yaml: &str| {
            desired_deployment(&ws(yaml), &cfg())
                .expect("builds")
                .spec
                .and_then(|s| s.template.spec)
                .expect("pod spec")
        };
        let has_volume = |p: &PodSpec| {
            p.volumes
                .iter()
                .flatten()
                .any(|v| v.name == GPU_LIST_VOLUME)
        };
        let vllm = pod("model: {name: m}\n");
        assert!(has_volume(&vllm));
        assert_eq!(
            vllm.containers[0].command.as_ref().map(|c| c[0].as_str()),
            Some("/bin/sh")
        );
        let mock = pod("model: {name: m}\nengine: {mode: mock}\n");
        assert!(!has_volume(&mock));
        assert_eq!(
            mock.containers[0].command.as_deref(),
            Some(&["kvroute-mock-vllm".to_string()][..])
        );
        let sidecar_env = |p: &PodSpec| {
            p.containers[1]
                .env
                .iter()
                .flatten()
                .any(|e| e.name == "NVIDIA_VISIBLE_DEVICES")
        };
        assert!(sidecar_env(&vllm) && !sidecar_env(&mock));
    }

    #[test]
    fn engine_is_wrapped_sidecar_sees_all_gpus_and_reads_the_list() {
        let mut p = pod();
        expose_engine_gpus(&mut p);
        let engine = &p.containers[0];
        let cmd = engine.command.clone().unwrap();
        assert_eq!(cmd[..2], ["/bin/sh".to_string(), "-c".to_string()]);
        assert_eq!(cmd[4..], ["vllm".to_string(), "serve".to_string()]);
        assert_eq!(
            engine.args.as_deref(),
            Some(&["m".to_string()][..]),
            "args untouched"
        );
        let sidecar = &p.containers[1];
        let env = |n: &str| {
            sidecar
                .env
                .iter()
                .flatten()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(env("NVIDIA_VISIBLE_DEVICES").as_deref(), Some("all"));
        assert_eq!(
            env("NVIDIA_DRIVER_CAPABILITIES").as_deref(),
            Some("utility")
        );
        assert_eq!(
            env("KVROUTE_SIDECAR_GPU_DEVICES_FILE").as_deref(),
            Some(GPU_LIST_FILE)
        );
        let ro = |c: &Container| {
            c.volume_mounts
                .iter()
                .flatten()
                .find(|m| m.name == GPU_LIST_VOLUME)
                .and_then(|m| m.read_only)
        };
        assert_eq!((ro(engine), ro(sidecar)), (Some(false), Some(true)));
        assert_eq!(p.volumes.as_ref().map(Vec::len), Some(1));
        assert!(GPU_LIST_FILE.starts_with(GPU_LIST_DIR));
    }

    /// Runs the wrapper with `sh` in a scratch directory standing in for the volume, with a
    /// PATH holding only `mv` and `echo` (the engine): no `nvidia-smi`, so it writes the
    /// device plugin's list, then runs the engine with its arguments intact.
    #[test]
    fn wrapper_writes_the_list_and_execs_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        for tool in ["mv", "echo"] {
            std::os::unix::fs::symlink(format!("/bin/{tool}"), bin.join(tool)).unwrap();
        }
        let file = dir.path().join("devices");
        let script = WRAPPER_SCRIPT.replace(GPU_LIST_FILE, &file.display().to_string());
        let out = Command::new("/bin/sh")
            .args(["-c", &script, WRAPPER_NAME, "echo", "engine", "a b"])
            .env("PATH", &bin)
            .env("NVIDIA_VISIBLE_DEVICES", "GPU-1,GPU-2")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "engine a b\n");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "GPU-1,GPU-2\n");
        assert!(!dir.path().join("devices.tmp").exists());
    }
}
