// Present only so cargo resolves this crate's [build-dependencies] (see Cargo.toml).
fn main() {}
