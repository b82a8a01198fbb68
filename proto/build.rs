//! Compiles `proto/kvroute.proto` into the tonic client and server code that `src/lib.rs`
//! includes, with the vendored `protoc` unless `PROTOC` names one.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY-free: build scripts are single-threaded when this runs.
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // Edition 2024 makes set_var unsafe; hand the path to prost-build via its config instead.
        let mut config = tonic_prost_build::Config::new();
        config.protoc_executable(protoc);
        tonic_prost_build::configure().compile_with_config(
            config,
            &["proto/kvroute.proto"],
            &["proto"],
        )?;
    } else {
        tonic_prost_build::configure().compile_protos(&["proto/kvroute.proto"], &["proto"])?;
    }
    println!("cargo:rerun-if-changed=proto/kvroute.proto");
    Ok(())
}
