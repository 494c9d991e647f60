//! The `dflash-analyze` binary: parse options, load, analyse, report. The work lives in
//! the library; this file only wires it to the terminal and to exit codes.

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use dflash_analyze::cli::{self, Cli, ColorWhen, Command};
use dflash_analyze::compare::{self, CompareOptions};
use dflash_analyze::{
    breakdown, export, load, plot, render, report, synth, LoadError, LoadOptions, Trace,
};

/// Exit codes: 0 success, 1 a regression flagged under --fail-on-regression, 2 errors.
enum Outcome {
    Ok,
    Regression,
}

fn main() -> ExitCode {
    fixed_mmap_threshold();
    match run() {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Regression) => ExitCode::from(1),
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Buffers of 256 KiB and more get pages of their own from the kernel. By default glibc
/// raises that threshold (up to 32 MiB) after a large buffer is freed, and then serves the
/// column buffers of a many-part load from its heaps. A buffer regrown there is copied and
/// its old place stays resident. With a fixed threshold a regrown buffer is remapped
/// without a copy, and a freed one goes straight back to the kernel. That keeps the peak
/// memory of a load below the size of the file.
fn fixed_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes an allocator parameter; it is called before any thread
    // is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

fn color_enabled(when: ColorWhen) -> bool {
    match when {
        ColorWhen::Always => true,
        ColorWhen::Never => false,
        ColorWhen::Auto => std::env::var_os("NO_COLOR").is_none() && io::stdout().is_terminal(),
    }
}

fn load_run(path: &Path, threads: usize, verbose: bool) -> anyhow::Result<Trace> {
    let trace = load::load(
        path,
        &LoadOptions {
            progress: true,
            threads,
            ..Default::default()
        },
    )
    .map_err(|e: LoadError| anyhow::Error::new(e))?;
    for w in &trace.warnings {
        eprintln!("warning: {}: {w}", trace.path.display());
    }
    if verbose {
        for s in &trace.stats.skipped {
            eprintln!("skipped: {}: {s}", trace.path.display());
        }
    }
    Ok(trace)
}

/// Writes to stdout; a closed pipe ends the program quietly.
fn emit(text: &str) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

fn json<T: serde::Serialize>(v: &T) -> anyhow::Result<String> {
    let mut s = serde_json::to_string_pretty(v)?;
    s.push('\n');
    Ok(s)
}

/// Output directories are made before the long work, so a bad path fails at once.
fn prepare_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.to_path_buf())
}

fn run() -> anyhow::Result<Outcome> {
    let cli = Cli::parse();
    let color = color_enabled(cli.color);
    let load_run = |path: &Path| load_run(path, cli.threads, cli.verbose);
    match cli.command {
        Command::Breakdown(a) => {
            let trace = load_run(&a.run)?;
            let b = breakdown::breakdown(&trace).context("computing the breakdown")?;
            emit(&if a.json {
                json(&b)?
            } else {
                render::breakdown(&b, a.top, color)
            })?;
        }
        Command::Plot(a) => {
            let dir = prepare_dir(&a.out)?;
            let trace = load_run(&a.run)?;
            let b = breakdown::breakdown(&trace).context("computing the breakdown")?;
            for p in plot::plot_run(&trace, &b, &dir)? {
                emit(&format!("{}\n", p.display()))?;
            }
        }
        Command::Compare(a) => return compare_runs(&a, color, &load_run),
        Command::Export(a) => {
            let dir = prepare_dir(&a.out)?;
            let trace = load_run(&a.run)?;
            let format = match a.format {
                cli::ExportFormat::Parquet => export::Format::Parquet,
                cli::ExportFormat::Csv => export::Format::Csv,
            };
            for p in export::export(&trace, format, &dir)? {
                emit(&format!("{}\n", p.display()))?;
            }
        }
        Command::Report(a) => {
            // Fail on an unwritable path before loading.
            std::fs::File::create(&a.out)
                .with_context(|| format!("creating {}", a.out.display()))?;
            let ta = load_run(&a.run)?;
            let tb = a.run_b.as_deref().map(load_run).transpose()?;
            let html = report::report(&ta, tb.as_ref(), a.noise)?;
            std::fs::write(&a.out, html).with_context(|| format!("writing {}", a.out.display()))?;
            emit(&format!("{}\n", a.out.display()))?;
        }
        Command::Info(a) => info(&a, &load_run(&a.run)?)?,
        Command::Synth(a) => {
            let spec = synth::SynthSpec {
                seed: a.seed,
                steps: a.steps,
                layers: a.layers,
                noise: a.noise,
                scale: a.scale,
                host_factor: a.host_factor,
                gpu: !a.no_gpu,
                ..Default::default()
            };
            if a.out.as_os_str() == "-" {
                synth::write_trace(io::BufWriter::new(io::stdout().lock()), &spec)?;
            } else {
                let f = std::fs::File::create(&a.out)
                    .with_context(|| format!("creating {}", a.out.display()))?;
                synth::write_trace(io::BufWriter::with_capacity(1 << 20, f), &spec)
                    .with_context(|| format!("writing {}", a.out.display()))?;
            }
        }
    }
    Ok(Outcome::Ok)
}

/// `compare`: both runs, the comparison on stdout, its plots if asked; a flagged
/// regression under `--fail-on-regression` is the outcome.
fn compare_runs(
    a: &cli::CompareArgs,
    color: bool,
    load_run: &dyn Fn(&Path) -> anyhow::Result<Trace>,
) -> anyhow::Result<Outcome> {
    if !(0.0..1.0).contains(&a.noise) {
        anyhow::bail!("--noise {} must lie in [0, 1)", a.noise);
    }
    if !(0.0..1.0).contains(&a.min_effect) {
        anyhow::bail!("--min-effect {} must lie in [0, 1)", a.min_effect);
    }
    let plot_dir = a.plot.as_deref().map(prepare_dir).transpose()?;
    let ta = load_run(&a.run_a)?;
    let tb = load_run(&a.run_b)?;
    let opts = CompareOptions {
        noise: a.noise,
        alpha: a.alpha,
        seed: a.seed,
        min_effect: a.min_effect,
    };
    let (c, _, _) = compare::compare(&ta, &tb, &opts).context("comparing the runs")?;
    emit(&if a.json {
        json(&c)?
    } else {
        render::comparison(&c, color)
    })?;
    if let Some(dir) = plot_dir {
        for p in plot::plot_compare(&c, &dir)? {
            eprintln!("wrote {}", p.display());
        }
    }
    if a.fail_on_regression && c.regressions > 0 {
        return Ok(Outcome::Regression);
    }
    Ok(Outcome::Ok)
}

/// `info`: what was read and how fast.
fn info(a: &cli::InfoArgs, trace: &Trace) -> anyhow::Result<()> {
    let s = &trace.stats;
    if a.json {
        emit(&json(s)?)?;
    } else {
        emit(&format!(
            "{}: {} bytes ({} of JSON), {} events -> {} spans, {} counter values, {} flow ends in {:.3} s ({:.0} MB/s; scan {:.3} s, tables {:.3} s)\n",
            trace.path.display(),
            s.file_bytes,
            s.json_bytes,
            s.events,
            s.spans,
            s.counters,
            s.flows,
            s.seconds,
            s.file_bytes as f64 / 1e6 / s.seconds.max(1e-9),
            s.scan_seconds,
            s.seconds - s.scan_seconds,
        ))?;
        // A resumed run's segments, in the order they were joined.
        if s.segments.len() > 1 {
            for (k, f) in s.segments.iter().enumerate() {
                let n = s.segments.len();
                emit(&format!("  file {} of {n}: {}\n", k + 1, f.display()))?;
            }
        }
    }
    Ok(())
}
