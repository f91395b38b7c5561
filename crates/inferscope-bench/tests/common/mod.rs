//! Shared by the bench's test binaries: `bench serve` arguments against a mock.

use clap::Parser;
use inferscope_bench::ServeArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

/// `bench serve` arguments for the mock at `base`, plus `extra` flags.
pub fn args(base: &str, extra: &[&str]) -> ServeArgs {
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
