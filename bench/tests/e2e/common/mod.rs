//! Helpers shared by the bench crate's end-to-end tests.

use std::path::{Path, PathBuf};

/// Taken by every test that starts `meridian` processes: nextest runs each test in its own
/// process, but plain `cargo test` runs this binary's tests as threads of one, and
/// `compare_e2e` counts every `meridian` child of its process.
pub static SERVERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
