//! `kvroute crdgen`: writes the CRD YAML (crds/), the OLM bundle (bundle/), the plain manifests
//! and the Helm charts (deploy/, deploy/helm/), the dashboards and monitors (deploy/grafana/,
//! deploy/monitoring/) and the CRD reference (docs/reference/crds.md) from the Rust types, or
//! with `--check` verifies that the committed files match.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::bundle::{bundle_files, deploy_files};
use crate::generated::{GeneratedFile, crd_files, reference_files};

/// Flags of `kvroute crdgen`.
#[derive(Debug, Clone, clap::Args)]
pub struct CrdgenArgs {
    /// Directory for the CRD YAML files.
    #[arg(long, env = "KVROUTE_CRDGEN_CRDS_DIR", default_value = "crds")]
    pub crds_dir: PathBuf,
    /// Directory of the OLM bundle.
    #[arg(long, env = "KVROUTE_CRDGEN_BUNDLE_DIR", default_value = "bundle")]
    pub bundle_dir: PathBuf,
    /// Directory for plain deployment manifests (operator RBAC and Deployment).
    #[arg(long, env = "KVROUTE_CRDGEN_DEPLOY_DIR", default_value = "deploy")]
    pub deploy_dir: PathBuf,
    /// Directory of the user docs; the CRD reference goes to `<docs-dir>/reference/crds.md`.
    #[arg(long, env = "KVROUTE_CRDGEN_DOCS_DIR", default_value = "docs")]
    pub docs_dir: PathBuf,
    /// Compare instead of writing; fail listing the files that differ.
    #[arg(long, env = "KVROUTE_CRDGEN_CHECK", default_value_t = false)]
    pub check: bool,
}

/// Every generated file (CRDs, bundle, deploy manifests, dashboards and monitors).
pub fn all_files(args: &CrdgenArgs) -> anyhow::Result<Vec<GeneratedFile>> {
    let mut files = crd_files(&args.crds_dir)?;
    files.extend(bundle_files(&args.bundle_dir)?);
    files.extend(deploy_files(&args.deploy_dir)?);
    files.extend(crate::monitoring::monitoring_files(&args.deploy_dir)?);
    files.extend(crate::helm::helm_files(&args.deploy_dir.join("helm"))?);
    files.extend(reference_files(&args.docs_dir));
    Ok(files)
}

/// Files whose content on disk differs from `files` (missing files included).
pub fn drifted(files: &[GeneratedFile]) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|f| std::fs::read_to_string(&f.path).ok().as_deref() != Some(f.content.as_str()))
        .map(|f| f.path.clone())
        .collect()
}

/// Runs the command.
pub async fn run(args: CrdgenArgs) -> anyhow::Result<()> {
    let files = all_files(&args)?;
    if args.check {
        let stale = drifted(&files);
        if !stale.is_empty() {
            anyhow::bail!(
                "generated files are out of date (run `kvroute crdgen`): {}",
                stale
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        println!("{} generated files are up to date", files.len());
        return Ok(());
    }
    for f in &files {
        if let Some(dir) = f.path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&f.path, &f.content)
            .with_context(|| format!("writing {}", f.path.display()))?;
        println!("wrote {}", f.path.display());
    }
    Ok(())
}
