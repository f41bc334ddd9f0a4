use clap::Parser;

fn main() {
    let code = match pipeprof::commands::run(pipeprof::cli::Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            // The message may carry file names or a panic's text: no escape codes off a terminal.
            pipeprof_trainer::progress::say(&format!("error: {e:#}"));
            std::process::exit(1);
        }
    };
    if code != 0 {
        std::process::exit(code);
    }
    if let Some(sig) = pipeprof_core::signal::received() {
        std::process::exit(128 + sig);
    }
}
