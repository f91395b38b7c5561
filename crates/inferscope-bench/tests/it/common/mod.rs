//! Shared by the bench's test binaries: `bench serve` arguments against a mock.

use clap::Parser;
use inferscope_bench::BenchServeArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchServeArgs,
}

/// `bench serve` arguments for the mock at `base`, plus `extra` flags.
pub fn args(base: &str, extra: &[&str]) -> BenchServeArgs {
    let mut argv = vec![
        "bench",
        "--base-url",
        base,
        "--model",
        "mock-model",
        "--disable-tqdm",
    ];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).expect("valid arguments").args
}
