//! Compiles the vendored kubelet APIs (`proto/`) with protox, a protobuf compiler in Rust, so the
//! build needs no `protoc` binary: the device-plugin API (`api.proto`), the plugin registration
//! API and the DRA plugin API (`v1`, `v1beta1`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: [&str; 4] = [
        "api.proto",
        "pluginregistration/v1/api.proto",
        "dra/v1/api.proto",
        "dra/v1beta1/api.proto",
    ];
    for p in PROTOS {
        println!("cargo:rerun-if-changed=proto/{p}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
