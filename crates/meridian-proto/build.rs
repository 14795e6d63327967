fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure().bytes(".").compile_protos(
        &["../../proto/meridian.proto", "../../proto/raft.proto"],
        &["../../proto"],
    )?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
