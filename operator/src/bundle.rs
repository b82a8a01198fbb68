//! OLM bundle generation (in progress).

use std::path::Path;

use crate::crdgen::GeneratedFile;

/// Bundle files.
pub fn bundle_files(_dir: &Path) -> anyhow::Result<Vec<GeneratedFile>> {
    Ok(Vec::new())
}

/// Plain deploy manifests.
pub fn deploy_files(_dir: &Path) -> anyhow::Result<Vec<GeneratedFile>> {
    Ok(Vec::new())
}
