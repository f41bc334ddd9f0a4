use clap::Parser;
use pipeprof::cli::{Cli, Command};

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command.unwrap_or_else(|| Command::Profile(Box::default())) {
        Command::Profile(args) => pipeprof::profile::run(&args).map(|_| ()),
        Command::Attach(a) => pipeprof::attach::run(&a).map(|_| ()),
        Command::Report(a) => pipeprof::offline::run(&a),
        Command::Cache(a) => pipeprof::cache::run(&a),
        Command::DemoData(a) => {
            let spec = pipeprof::data::demo::DemoSpec {
                classes: a.classes,
                per_class: a.per_class,
                size: a.size,
                format: a.format,
                seed: a.seed,
            };
            let n = spec.write(&a.dir).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", a.dir.display()))?;
            println!("wrote {n} images in {} classes to {}", spec.classes, a.dir.display());
            Ok(())
        }
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
    if let Some(sig) = pipeprof::signal::received() {
        std::process::exit(128 + sig);
    }
}
