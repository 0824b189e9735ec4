//! `weft pull NAME` and `weft models`.

use weft::Hub;

use crate::progress::Bar;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model name (see `weft models`).
    #[arg(default_value = weft::hub::DEFAULT_MODEL)]
    name: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let hub = Hub::from_env()?;
    let spec = weft::hub::find(&args.name).ok_or_else(|| {
        let known: Vec<&str> = weft::hub::known_models().iter().map(|m| m.name).collect();
        anyhow::anyhow!(
            "unknown model {:?}; known models: {}",
            args.name,
            known.join(", ")
        )
    })?;
    let path = hub.pull(spec, &mut Bar::default())?;
    println!("{}", path.display());
    Ok(())
}

pub fn list() -> anyhow::Result<()> {
    let hub = Hub::from_env()?;
    for spec in weft::hub::known_models() {
        let status = match hub.cached_path(spec) {
            Some(p) => format!("cached at {}", p.display()),
            None => "not fetched yet".to_string(),
        };
        let mut notes: Vec<String> = spec.aliases.iter().map(|a| format!("alias {a}")).collect();
        if spec.name == weft::hub::DEFAULT_MODEL {
            notes.push("default".into());
        }
        let notes = match notes.is_empty() {
            true => String::new(),
            false => format!(" ({})", notes.join(", ")),
        };
        println!("{}{notes}: {} — {status}", spec.name, spec.description);
    }
    Ok(())
}
