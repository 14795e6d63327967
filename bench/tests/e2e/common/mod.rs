//! Helpers shared by the bench crate's end-to-end tests.

use std::path::{Path, PathBuf};

/// `<target>/release/meridian`, from the test's path `<target>/release/deps/<test>-…`.
pub fn meridian_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("locating the test executable");
    let release = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lives in <target>/<profile>/deps");
    let binary = release.join("meridian");
    assert!(
        binary.is_file(),
        "{} is missing: build meridian-cli first (`cargo build --release -p meridian-cli`; \
         `cargo nextest run --workspace --release` builds it)",
        binary.display()
    );
    binary
}
