//! The `jobhost` binary: parses flags, sets up logging, runs the command.

use clap::Parser;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // Die quietly when stdout is closed early (`jobhost jobs | head`), as
    // command-line tools do, instead of panicking on the failed write.
    // SAFETY: setting a signal's disposition to the default before any
    // thread exists has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = jobhost::cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(args.log_filter()));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match args.log_format {
        // The span's fields (a run's job id, type, attempt, host) on every
        // line, flattened beside the event's own, not a list of spans.
        jobhost::cli::LogFormat::Json => logs.json().with_current_span(true).with_span_list(false).init(),
        jobhost::cli::LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
    jobhost::cli::main(args)
}
