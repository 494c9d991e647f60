//! The command line, declared and nothing else. `Options` in `main.rs` is built from it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const EXAMPLES: &str = "\
Examples:
  dflash-analyze breakdown runs/a                 per-section table and findings
  dflash-analyze breakdown runs/a/trace.json.gz --json > a.json
  dflash-analyze plot runs/a --out plots/a        PNG and SVG charts
  dflash-analyze compare runs/a runs/b --fail-on-regression
  dflash-analyze export runs/a --format parquet --out frames/a
  dflash-analyze report runs/a runs/b --out report.html
  dflash-analyze breakdown kineto_trace.pt.trace.json   (PyTorch profiler traces work too)";

/// Reads dflash (and PyTorch-profiler) traces: per-section breakdowns, plots, statistical
/// comparisons of two runs, exports and HTML reports.
///
/// RUN is a run directory holding trace.json or trace.json.gz, or a trace file (.json or
/// .json.gz). Exit codes: 0 success, 1 a regression was flagged with
/// --fail-on-regression, 2 bad input or another error.
#[derive(Debug, Parser)]
#[command(name = "dflash-analyze", version, after_help = EXAMPLES)]
pub struct Cli {
    /// When to colour terminal output. The default, auto, colours only a terminal and
    /// honours NO_COLOR.
    #[arg(long, value_enum, default_value_t = ColorWhen::Auto, global = true)]
    pub color: ColorWhen,

    /// Threads that parse an uncompressed trace, each a part of the file; 0 (the
    /// default) uses one per core.
    #[arg(long, default_value_t = 0, global = true)]
    pub threads: usize,

    /// Also list, on stderr, every kind of event the loader skipped or did not use, with
    /// the first of each (index, byte offset, what was wrong).
    #[arg(long, short, global = true)]
    pub verbose: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorWhen {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per-section times (count, total, mean, p50, p95, share of step), CPU vs GPU time,
    /// self vs inclusive time, a per-step table, queue waits and depth, GPU idle time,
    /// and the top findings in words.
    Breakdown(BreakdownArgs),
    /// Draws stacked per-step section times, section shares, CPU vs GPU per section, the
    /// step-time distribution and the queue depth over time, as PNG and SVG.
    Plot(PlotArgs),
    /// Compares two runs section by section: median ratio B/A with a bootstrap confidence
    /// interval, a Mann-Whitney U test, Holm's correction, and a noise band. A slower host
    /// (every CPU section shifted alike) is reported once, not as many regressions; a
    /// change under --min-effect of the step is not flagged, and when both runs are
    /// GPU-bound the CPU sections' changes are host slack, reported once and not counted.
    Compare(CompareArgs),
    /// Writes the loaded frames (spans, counters, flows, threads, sections, steps) as
    /// Parquet or CSV files.
    Export(ExportArgs),
    /// Writes one self-contained HTML page with the breakdown (and the comparison when a
    /// second run is given), tables and plots embedded.
    Report(ReportArgs),
    /// Loads a trace and prints what was read and how fast (used by the load benchmark).
    Info(InfoArgs),
    /// Writes a synthetic dflash trace (for tests and benchmarks).
    #[command(hide = true)]
    Synth(SynthArgs),
}

#[derive(Debug, Args)]
pub struct BreakdownArgs {
    /// Run directory or trace file.
    pub run: PathBuf,
    /// Print JSON (documented in docs/analyze-json.md) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Rows of the per-section table to print; 0 prints all. The default is 30.
    #[arg(long, default_value_t = 30)]
    pub top: usize,
}

#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Run directory or trace file.
    pub run: PathBuf,
    /// Directory to write the pictures into; created if missing.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The baseline run (directory or trace file).
    pub run_a: PathBuf,
    /// The run compared against the baseline.
    pub run_b: PathBuf,
    /// Print JSON (documented in docs/analyze-json.md) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Relative change that counts as noise: a section is flagged only when its whole
    /// confidence interval lies outside 1 +- NOISE. The default is 0.02 (2%).
    #[arg(long, default_value_t = 0.02)]
    pub noise: f64,
    /// Smallest change that counts, as a share of A's median step time: a section whose
    /// median moved by less is not flagged, however significant. The default is 0.005
    /// (0.5% of the step).
    #[arg(long, default_value_t = crate::compare::MIN_EFFECT)]
    pub min_effect: f64,
    /// Significance level after Holm's correction over all sections. The default is 0.05.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// Exit with code 1 when a regression is flagged (one not explained by a slower host,
    /// nor host slack in a GPU-bound pair).
    #[arg(long)]
    pub fail_on_regression: bool,
    /// Also draw A-vs-B plots per section into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Seed of the bootstrap. The default is 1.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    Parquet,
    Csv,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Run directory or trace file.
    pub run: PathBuf,
    /// File format.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// Directory to write spans, counters, flows, threads, sections and steps into.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run directory or trace file.
    pub run: PathBuf,
    /// A second run: the report then also compares RUN (as A) with RUN_B (as B).
    pub run_b: Option<PathBuf>,
    /// The HTML file to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Noise band of the comparison, as in `compare`. The default is 0.02.
    #[arg(long, default_value_t = 0.02)]
    pub noise: f64,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Run directory or trace file.
    pub run: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// File to write; `-` writes to stdout.
    #[arg(long)]
    pub out: PathBuf,
    /// Number of steps. The default is 30.
    #[arg(long, default_value_t = 30)]
    pub steps: u32,
    /// Random seed. The default is 1.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Drafter layers. The default is 2.
    #[arg(long, default_value_t = 2)]
    pub layers: u32,
    /// Scale one section's durations, as NAME=FACTOR; repeatable.
    #[arg(long, value_parser = parse_scale)]
    pub scale: Vec<(String, f64)>,
    /// Scale every CPU-side duration (a slower host). The default is 1.
    #[arg(long, default_value_t = 1.0)]
    pub host_factor: f64,
    /// Leave out GPU spans (a CPU-only run).
    #[arg(long)]
    pub no_gpu: bool,
    /// Relative spread of durations. The default is 0.03.
    #[arg(long, default_value_t = 0.03)]
    pub noise: f64,
}

fn parse_scale(s: &str) -> Result<(String, f64), String> {
    let (name, f) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not NAME=FACTOR"))?;
    let f: f64 = f
        .parse()
        .map_err(|_| format!("`{f}` in `{s}` is not a number"))?;
    Ok((name.to_string(), f))
}

/// The clap command, for tests and help.
pub fn build_command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_is_consistent() {
        super::build_command().debug_assert();
    }
}
