use clap::Parser;

fn main() {
    if let Err(e) = pipeprof::commands::run(pipeprof::cli::Cli::parse()) {
        // The message may carry file names or a panic's text: no escape codes off a terminal.
        pipeprof::progress::say(&format!("error: {e:#}"));
        std::process::exit(1);
    }
    if let Some(sig) = pipeprof::signal::received() {
        std::process::exit(128 + sig);
    }
}
