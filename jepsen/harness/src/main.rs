//! `meridian-jepsen`: the fault-injection harness (work in progress).

fn main() {
    eprintln!("meridian-jepsen: not implemented yet");
    std::process::exit(2);
}
