//! Compiles kubelet's DRA, DRA health and plugin registration protos (dra/proto/, ours,
//! written from the published API) with protox, a protobuf compiler in Rust, so no system
//! `protoc` is needed; tonic's build crate generates servers and clients from the result.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/pluginregistration/api.proto",
        "proto/dra-health/v1alpha1/api.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
