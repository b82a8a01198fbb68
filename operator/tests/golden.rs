//! Golden test: the committed crds/*.yaml, bundle/, deploy/ and docs/reference/crds.md files must equal what
//! `kvroute crdgen` generates from the Rust types. Regenerate with `kvroute crdgen` from the
//! repository root, or `KVROUTE_UPDATE_GOLDEN=1 cargo test -p kvroute-operator --test golden`.

use std::path::PathBuf;

use kvroute_operator::crdgen::{CrdgenArgs, all_files, drifted};

fn args() -> CrdgenArgs {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    CrdgenArgs {
        crds_dir: root.join("crds"),
        bundle_dir: root.join("bundle"),
        deploy_dir: root.join("deploy"),
        docs_dir: root.join("docs"),
        check: true,
    }
}

#[test]
fn committed_generated_files_match_the_rust_types() {
    let files = all_files(&args()).expect("generates");
    if std::env::var_os("KVROUTE_UPDATE_GOLDEN").is_some() {
        for f in &files {
            std::fs::create_dir_all(f.path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&f.path, &f.content).expect("write");
        }
    }
    let stale = drifted(&files);
    assert!(
        stale.is_empty(),
        "out of date (run `kvroute crdgen`): {stale:?}"
    );
    assert!(files.len() >= 5);
}
