//! `weft pull NAME` and `weft models`.

use weft::Hub;

use crate::progress::Bar;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model name (see `weft models`). A cached model is hashed again, and fetched again if
    /// it no longer matches.
    #[arg(default_value = weft::hub::DEFAULT_MODEL)]
    name: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let hub = Hub::from_env()?;
    let spec = weft::hub::find(&args.name).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown model {:?}; known models: {}",
            args.name,
            weft::hub::known_names()
        )
    })?;
    let path = hub.pull_rehashed(spec, &mut Bar::default())?;
    outln!("{}", path.display())?;
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Remove the cached conversions (checkpoint folders, widened GGUF files) that no load
    /// will use again: their source moved, changed or is gone.
    #[arg(long)]
    prune: bool,
}

pub fn list(args: ListArgs) -> anyhow::Result<()> {
    // The known models are listed without a cache too (neither WEFT_HOME nor HOME set).
    let cache = Hub::from_env();
    if args.prune {
        let hub = cache?;
        let removed = weft::prune_conversions(hub.home())?;
        for c in &removed {
            outln!("removed {} ({})", c.file.display(), size(c.bytes))?;
        }
        let freed = removed.iter().map(|c| c.bytes).sum();
        outln!(
            "{} removed, {} freed",
            crate::count(removed.len(), "file"),
            size(freed)
        )?;
        return Ok(());
    }
    let hub = match cache {
        Ok(hub) => Some(hub),
        Err(e) => {
            errln!("weft: {e}: no model is cached");
            None
        }
    };
    for spec in weft::hub::known_models() {
        let status = match hub.as_ref().and_then(|h| h.cached_path(spec)) {
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
        outln!("{}{notes}: {} — {status}", spec.name, spec.description)?;
    }
    let Some(hub) = hub else { return Ok(()) };
    let conversions = weft::conversions(hub.home());
    if !conversions.is_empty() {
        let total = conversions.iter().map(|c| c.bytes).sum();
        let stale: Vec<_> = conversions.iter().filter(|c| !c.current).collect();
        out!(
            "conversions: {} in {} ({})",
            conversions.len(),
            hub.home().join("converted").display(),
            size(total)
        )?;
        match stale.len() {
            0 => outln!()?,
            n => outln!(
                "; {n} of them ({}) will not be used again (source moved, changed or gone) or \
                 were made by an older weft: `weft models --prune` removes them",
                size(stale.iter().map(|c| c.bytes).sum())
            )?,
        }
    }
    Ok(())
}

/// Bytes as MiB or GiB.
fn size(bytes: u64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    match mib >= 1024.0 {
        true => format!("{:.1} GiB", mib / 1024.0),
        false => format!("{mib:.0} MiB"),
    }
}
