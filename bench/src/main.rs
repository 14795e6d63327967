//! `meridian-ycsb`: YCSB core workloads against Meridian, etcd or embedded RocksDB.
//! See `bench/README.md` and [`meridian_bench::cli`].

use std::process::ExitCode;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("meridian-ycsb: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(meridian_bench::cli::run_cli(std::env::args_os())) {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            // clap's own errors (including --help and --version) print themselves.
            if let Some(clap_error) = error.downcast_ref::<clap::Error>() {
                let _ = clap_error.print();
                return if clap_error.use_stderr() {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            eprintln!("meridian-ycsb: {error:#}");
            ExitCode::FAILURE
        }
    }
}
