//! Compiles the KServe v2 gRPC protocol (`proto/`) into the server's message types and
//! service trait. The `.proto` files are parsed in Rust (protox), so building needs no
//! `protoc`; the descriptor set is kept too, for reading configurations and
//! statistics from their JSON form into protobuf messages.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["grpc_service.proto"], ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("inference_descriptor.bin"), prost::Message::encode_to_vec(&descriptors))?;
    // Tensor contents as `bytes::Bytes`: a request's raw inputs are slices of the buffer
    // tonic decoded the message from (no copy), and a response's raw outputs slices of
    // the buffers the data plane produced them in.
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .compile_fds(descriptors)?;
    Ok(())
}
