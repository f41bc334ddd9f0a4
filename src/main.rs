use clap::Parser;

fn main() {
    if let Err(e) = pipeprof::commands::run(pipeprof::cli::Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
    if let Some(sig) = pipeprof::signal::received() {
        std::process::exit(128 + sig);
    }
}
