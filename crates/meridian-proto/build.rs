fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        .bytes(".")
        // Undecodable bodies are INVALID_ARGUMENT, not INTERNAL (see src/codec.rs).
        .codec_path("crate::codec::CheckedCodec")
        .compile_protos(
            &["../../proto/meridian.proto", "../../proto/raft.proto"],
            &["../../proto"],
        )?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
