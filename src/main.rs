//! The `jobhost` binary: parses flags, sets up logging, runs the command.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = jobhost::cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(args.log_filter())),
        )
        .with_writer(std::io::stderr)
        .init();
    jobhost::cli::main(args)
}
