//! `dflash`: parse options, prepare the run, train, report.
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Parser;

use dflash::model::TargetConfig;
use dflash::run_files;
use dflash::train::bpe::{self, BpeError};
use dflash::train::config::{Layer, TrainConfig};
use dflash::train::pipeline::{self, RunOptions, RunReport, RunStatus, TrainError};
use dflash::train::prepare;
use dflash::train::pretrain::{self, PretrainConfig};
use dflash::train::records::{DataError, Format};
use dflash::train::run_log::WARMUP_STEPS;
use dflash::train::tokenizer::{self, HfTokenizer, Tokenizer};

mod cli;
use cli::{Cli, Command, PrepareArgs, PretrainArgs, TokenizerArgs, TrainArgs};

/// An error the user can fix: exit code 2.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("DFLASH_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // libtorch's out-of-memory errors raised as panics by tch's unchecked calls are caught
    // around each drafter step and reported in one line (exit 2); the default hook would
    // print them first, with libtorch's whole backtrace
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if !text.contains("out of memory") {
            default_hook(info);
        }
    }));
    // libtorch's OpenMP pool spins; with one pool per worker thread on a small CPU it
    // oversubscribes badly. One intra-op thread per worker unless the user says otherwise.
    if std::env::var_os("OMP_NUM_THREADS").is_none() {
        tch::set_num_threads(1);
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            let (line, usage) = match e.downcast_ref::<TrainError>() {
                // a training error's message is one complete line, its cause included
                Some(t) => (t.to_string(), t.is_usage()),
                None => (format!("{e:#}"), e.downcast_ref::<Usage>().is_some()),
            };
            eprintln!("error: {line}");
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Train(args) => train(args),
        Command::PretrainTarget(args) => pretrain_target(args).map(|()| ExitCode::SUCCESS),
        Command::PrepareData(args) => prepare_data(args).map(|()| ExitCode::SUCCESS),
        Command::TrainTokenizer(args) => train_tokenizer(args).map(|()| ExitCode::SUCCESS),
    }
}

fn usage(e: impl std::fmt::Display) -> anyhow::Error {
    Usage(e.to_string()).into()
}

/// The run directory: `--trace DIR` or `--run-dir DIR` (the same when both are given),
/// or a new `runs/train-<time>`.
fn run_dir(args: &TrainArgs) -> anyhow::Result<PathBuf> {
    Ok(match (&args.trace, &args.run_dir) {
        (Some(t), Some(r)) if t != r => bail!(Usage(format!(
            "--trace {} and --run-dir {} differ: the trace is written into the run directory, give one of them",
            t.display(),
            r.display()
        ))),
        (Some(d), _) | (None, Some(d)) => d.clone(),
        (None, None) => {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            PathBuf::from("runs").join(format!("train-{secs}"))
        }
    })
}

/// The settings the dedicated flags give.
fn flag_layer(a: &TrainArgs) -> Layer {
    let mut l = Layer::default();
    let path = |p: &PathBuf| p.display().to_string();
    if let Some(t) = &a.target {
        l.set("target", path(t));
    }
    if let Some(p) = &a.target_preset {
        l.set("target_preset", p.as_str());
    }
    if let Some(d) = &a.data {
        l.set("data", path(d));
    }
    if let Some(t) = &a.tokenizer {
        l.set("tokenizer", path(t));
    }
    if let Some(s) = a.steps {
        l.set("steps", s);
    }
    if let Some(d) = &a.target_devices {
        l.set("target_devices", d.clone());
    }
    if let Some(d) = &a.drafter_device {
        l.set("drafter_device", d.as_str());
    }
    if let Some(w) = &a.trace_steps {
        l.set("trace_steps", w.as_str());
    }
    if a.trace_gzip {
        l.set("trace_gzip", true);
    }
    if a.trace_kernels {
        l.set("trace_kernels", true);
    }
    l
}

/// The configuration: a base (the defaults, or on `--resume` the run's own), then the
/// `--config` file, the `--set`s and the flags, each only with the keys it gives.
fn train_config(args: &TrainArgs, run_dir: &Path) -> anyhow::Result<TrainConfig> {
    let base = if args.resume {
        TrainConfig::from_file(&run_dir.join(run_files::CONFIG))
            .map_err(|e| usage(format!("--resume: {e}")))?
    } else {
        TrainConfig::default()
    };
    let mut layers = Vec::new();
    if let Some(p) = &args.config {
        layers.push(Layer::from_file(p).map_err(usage)?);
    }
    layers.push(Layer::from_sets(&args.sets).map_err(usage)?);
    layers.push(flag_layer(args));
    base.layered(&layers).map_err(usage)
}

fn train(args: TrainArgs) -> anyhow::Result<ExitCode> {
    let run_dir = run_dir(&args)?;
    let cfg = train_config(&args, &run_dir)?;
    let opts = RunOptions {
        run_dir: run_dir.clone(),
        trace: args.trace.is_some(),
        resume: args.resume,
        stop_after: args.stop_after,
        quiet: args.quiet,
    };
    if !args.quiet {
        eprintln!("dflash train: run directory {}", run_dir.display());
    }
    let steps = cfg.steps;
    let report = pipeline::run(cfg, &opts)?;
    if report.status == RunStatus::AlreadyDone {
        let at = report.step;
        let name = run_dir.display();
        if at >= steps {
            eprintln!("{name} is already finished ({at} of {steps} steps): nothing to do");
        } else {
            eprintln!("{name} is already at step {at}, at or past --stop-after: nothing to do");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !args.quiet {
        print_report(&report, &run_dir);
    }
    // as shells expect: 128 + the signal (130 for SIGINT, 143 for SIGTERM)
    Ok(match report.signal_number {
        Some(sig) => ExitCode::from((128 + sig) as u8),
        None => ExitCode::SUCCESS,
    })
}

fn print_report(report: &RunReport, run_dir: &Path) {
    let how = match report.status {
        RunStatus::Stopped => "stopped",
        _ => "done",
    };
    match (report.losses.first(), report.losses.last()) {
        (Some(first), Some(last)) if report.timed_steps > 0 => eprintln!(
            "{how}: {} steps, loss {first:.4} -> {last:.4}, {:.0} tokens/s, {:.1} ms/step",
            report.steps_done, report.tokens_per_s, report.mean_step_ms
        ),
        (Some(first), Some(last)) => eprintln!(
            "{how}: {} steps, loss {first:.4} -> {last:.4}, throughput not measured \
             (the first {WARMUP_STEPS} steps of a run or resume are warm-up)",
            report.steps_done
        ),
        _ => eprintln!("{how}: no step trained in this run"),
    }
    if let (Some(b), Some(a)) = (report.heldout_before, report.heldout_after) {
        eprintln!(
            "held-out: loss {:.4} -> {:.4}, accuracy {:.3} -> {:.3}, tau_hat {:.2} -> {:.2}",
            b.loss, a.loss, b.accuracy, a.accuracy, b.tau_hat, a.tau_hat
        );
    }
    if let Some(c) = &report.trace_gpu_cost {
        eprintln!("GPU timing cost: {}", c.describe());
    }
    if let Some(t) = &report.trace {
        eprintln!(
            "trace: {} (open in https://ui.perfetto.dev, or run dflash-analyze breakdown {})",
            t.display(),
            run_dir.display()
        );
    }
}

fn pretrain_target(args: PretrainArgs) -> anyhow::Result<()> {
    let mut model_cfg = TargetConfig::preset(&args.preset)
        .ok_or_else(|| usage(format!("unknown --preset {:?}: use tiny", args.preset)))?;
    let tok = match &args.tokenizer {
        Some(p) => Tokenizer::Hf(Box::new(HfTokenizer::load(p).map_err(usage)?)),
        None => Tokenizer::Bytes,
    };
    if args.tokenizer.is_some() {
        model_cfg.vocab_size = tok.vocab_size() as i64;
    }
    let text = pretrain::read_corpus(&args.corpus).map_err(usage)?;
    let cfg = PretrainConfig {
        steps: args.steps,
        batch: args.batch,
        seq_len: args.seq_len,
        lr: args.lr,
        seed: args.seed,
    };
    let r = pretrain::pretrain(&text, &tok, &model_cfg, &cfg, &args.out, false)
        .context("pretraining the target")?;
    eprintln!(
        "pretrained {}: {} tokens of {} ({}, vocabulary {}), train loss {:.3} -> {:.3}, held-out loss {:.3} nats/token ({:.2} bits/byte)",
        args.out.display(),
        r.tokens,
        args.corpus.display(),
        tok.describe(),
        model_cfg.vocab_size,
        r.first_loss,
        r.last_loss,
        r.heldout_loss,
        r.heldout_bits_per_byte()
    );
    Ok(())
}

fn train_tokenizer(args: TokenizerArgs) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let classify = |e: BpeError| match &e {
        BpeError::Train(_) => e.into(),
        // a failed write is the machine's problem, unless the disk is full or the path
        // cannot be written
        BpeError::Write { source, .. }
            if !dflash::durable::is_disk_full(source)
                && !matches!(
                    source.kind(),
                    ErrorKind::NotFound
                        | ErrorKind::PermissionDenied
                        | ErrorKind::AlreadyExists
                        | ErrorKind::NotADirectory
                        | ErrorKind::ReadOnlyFilesystem
                ) =>
        {
            e.into()
        }
        _ => usage(e),
    };
    let t =
        bpe::train_file(&args.corpus, args.vocab_size, args.heldout_fraction).map_err(classify)?;
    bpe::write(&t, &args.out).map_err(classify)?;
    eprintln!(
        "trained {}: byte-level BPE of {} ids ({} merges) from the first {} bytes of {} in {:.1} s",
        args.out.join("tokenizer.json").display(),
        t.vocab_size,
        t.merges,
        t.trained_bytes,
        args.corpus.display(),
        t0.elapsed().as_secs_f64()
    );
    if t.vocab_size < args.vocab_size {
        eprintln!(
            "warning: the corpus has too few pairs left for --vocab-size {}: the vocabulary has {} ids",
            args.vocab_size, t.vocab_size
        );
    }
    Ok(())
}

fn prepare_data(args: PrepareArgs) -> anyhow::Result<()> {
    let target = args.target.unwrap_or_else(pipeline::default_target_dir);
    let vocab = prepare::target_vocab(&target).map_err(usage)?;
    let tok = tokenizer::resolve(args.tokenizer.as_deref(), Some(&target), vocab).map_err(usage)?;
    let t0 = std::time::Instant::now();
    let p = prepare::prepare(&args.data, &args.out, &tok, vocab).map_err(|e| match &e {
        // a failed write is the machine's problem, unless the disk is full or the path
        // cannot be written
        DataError::Write { source, .. }
            if !dflash::durable::is_disk_full(source)
                && !matches!(
                    source.kind(),
                    ErrorKind::NotFound | ErrorKind::PermissionDenied
                ) =>
        {
            e.into()
        }
        _ => usage(e),
    })?;
    for w in &p.warnings {
        eprintln!("warning: {w}");
    }
    let secs = t0.elapsed().as_secs_f64();
    let how = match p.format {
        Format::TokenIds => "ids as given".to_string(),
        _ => format!("tokenized with {}", tok.describe()),
    };
    eprintln!(
        "prepared {}: {} records, {} tokens ({} with a loss weight) of {} ({}, {how}) in {secs:.2} s ({:.0} tokens/s)",
        args.out.display(),
        p.records,
        p.tokens,
        p.weighted,
        args.data.display(),
        p.format.describe(),
        p.tokens as f64 / secs.max(1e-9)
    );
    Ok(())
}
