//! Generates the gRPC code from `proto/granary/v1/*.proto` with a vendored `protoc`, so a build
//! needs nothing but the Rust toolchain.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the environment.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        // Tensor payloads decode as `Bytes` slices of the receive buffer instead of copies.
        .bytes(".granary.v1.Tensor.data")
        .compile_protos(
            &["proto/granary/v1/dispatcher.proto", "proto/granary/v1/worker.proto"],
            &["proto"],
        )?;
    Ok(())
}
