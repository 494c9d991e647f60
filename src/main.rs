//! `dflash`: parse options, prepare the run, train, report.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Parser;

use dflash::model::Qwen3Config;
use dflash::train::config::TrainConfig;
use dflash::train::pipeline::{self, RunOptions, RunStatus, TrainError};
use dflash::train::pretrain::{self, PretrainConfig};

mod cli;
use cli::{Cli, Command, PretrainArgs, TrainArgs};

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
    // libtorch's OpenMP pool spins; with one pool per worker thread on a small CPU it
    // oversubscribes badly. One intra-op thread per worker unless the user says otherwise.
    if std::env::var_os("OMP_NUM_THREADS").is_none() {
        tch::set_num_threads(1);
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<Usage>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Train(args) => train(args),
        Command::PretrainTarget(args) => pretrain_target(args).map(|()| ExitCode::SUCCESS),
    }
}

fn usage(e: impl std::fmt::Display) -> anyhow::Error {
    Usage(e.to_string()).into()
}

/// Turns the flags into a configuration: file, then `--set`, then dedicated flags.
fn train_config(args: &TrainArgs) -> anyhow::Result<TrainConfig> {
    let base = match &args.config {
        Some(p) => TrainConfig::from_file(p).map_err(usage)?,
        None => TrainConfig::default(),
    };
    let mut cfg = base.with_overrides(&args.sets).map_err(usage)?;
    if args.target.is_some() {
        cfg.target = args.target.clone();
    }
    if args.target_preset.is_some() {
        cfg.target_preset = args.target_preset.clone();
    }
    if args.data.is_some() {
        cfg.data = args.data.clone();
    }
    if let Some(s) = args.steps {
        cfg.steps = s;
    }
    if let Some(d) = &args.target_devices {
        cfg.target_devices = d.clone();
    }
    if let Some(d) = &args.drafter_device {
        cfg.drafter_device = d.clone();
    }
    if args.trace_steps.is_some() {
        cfg.trace_steps = args.trace_steps.clone();
    }
    if args.trace_gzip {
        cfg.trace_gzip = true;
    }
    Ok(cfg)
}

fn train(args: TrainArgs) -> anyhow::Result<ExitCode> {
    let run_dir = match (&args.trace, &args.run_dir) {
        (Some(t), Some(r)) if t != r => bail!(Usage(format!(
            "--trace {} and --run-dir {} differ: the trace is written into the run directory, give one of them",
            t.display(),
            r.display()
        ))),
        (Some(d), _) | (None, Some(d)) => d.clone(),
        (None, None) => {
            let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            PathBuf::from("runs").join(format!("train-{secs}"))
        }
    };
    let mut cfg = train_config(&args)?;
    if args.resume {
        // the run's own configuration, with this command's overrides on top
        let saved = run_dir.join("config.toml");
        let base = TrainConfig::from_file(&saved).map_err(|e| usage(format!("--resume: {e}")))?;
        let fresh = TrainConfig::default()
            .with_overrides(&args.sets)
            .map_err(usage)?;
        cfg = merge_changed(base, &cfg, &fresh);
    }
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
    let report = pipeline::run(cfg, &opts).map_err(|e| match e {
        TrainError::Setup(m) => usage(m),
        other => anyhow::Error::new(other),
    })?;
    if report.status == RunStatus::AlreadyDone {
        if report.step >= steps {
            eprintln!(
                "{} is already finished ({} of {steps} steps): nothing to do",
                run_dir.display(),
                report.step
            );
        } else {
            eprintln!(
                "{} is already at step {}, at or past --stop-after: nothing to do",
                run_dir.display(),
                report.step
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !args.quiet {
        let first = report.losses.first().copied().unwrap_or(f64::NAN);
        let last = report.losses.last().copied().unwrap_or(f64::NAN);
        eprintln!(
            "done: {} steps, loss {first:.4} -> {last:.4}, {:.0} tokens/s, {:.1} ms/step",
            report.steps_done, report.tokens_per_s, report.mean_step_ms
        );
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
    // as shells expect: 128 + the signal (130 for SIGINT, 143 for SIGTERM)
    Ok(match report.signal_number {
        Some(sig) => ExitCode::from((128 + sig) as u8),
        None => ExitCode::SUCCESS,
    })
}

/// On resume: start from the saved config and apply only what this command changed
/// relative to the defaults.
fn merge_changed(saved: TrainConfig, now: &TrainConfig, defaults: &TrainConfig) -> TrainConfig {
    let saved_t = toml::Table::try_from(&saved).expect("serializes");
    let now_t = toml::Table::try_from(now).expect("serializes");
    let def_t = toml::Table::try_from(defaults).expect("serializes");
    let mut out = saved_t.clone();
    for (k, v) in now_t {
        if def_t.get(&k) != Some(&v) {
            out.insert(k, v);
        }
    }
    toml::Value::Table(out).try_into().unwrap_or(saved)
}

fn pretrain_target(args: PretrainArgs) -> anyhow::Result<()> {
    let model_cfg = Qwen3Config::preset(&args.preset)
        .ok_or_else(|| usage(format!("unknown --preset {:?}: use tiny", args.preset)))?;
    let text = pretrain::read_corpus(&args.corpus).map_err(usage)?;
    let cfg = PretrainConfig {
        steps: args.steps,
        batch: args.batch,
        seq_len: args.seq_len,
        lr: args.lr,
        seed: args.seed,
    };
    let (first, last, held) = pretrain::pretrain(&text, &model_cfg, &cfg, &args.out, false)
        .context("pretraining the target")?;
    eprintln!(
        "pretrained {}: train loss {first:.3} -> {last:.3}, held-out loss {held:.3} ({:.2} bits/byte)",
        args.out.display(),
        held / std::f64::consts::LN_2
    );
    Ok(())
}
