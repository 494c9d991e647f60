//! Command-line arguments of `dflash` (declarations only).
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "dflash",
    version,
    about = "Train DFlash block-diffusion drafters for speculative decoding, with a built-in trace recorder.",
    after_help = "Examples:\n  dflash train --trace runs/demo                  # embedded default: tiny BPE target + its continuations, traced\n  dflash train --target ckpt/Qwen3-8B --data train.jsonl --target-devices cuda:0 --drafter-device cuda:1 --trace runs/a\n  dflash train --config run.toml --set lr=3e-4 --set num_anchors=256\n  dflash train --target-preset realistic --target-devices cuda:0 --drafter-device cuda:0 --trace runs/k --trace-kernels\n  dflash train --resume --run-dir runs/a          # continue from the latest checkpoint\n  dflash prepare-data --target ckpt/Qwen3-8B --data chats.jsonl --out chats.tok\n  dflash train-tokenizer --corpus fixtures/corpus/train.txt --vocab-size 512 --out tok\n  dflash pretrain-target --corpus fixtures/corpus/train.txt --tokenizer tok --out fixtures/tiny-target-bpe"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a drafter: target workers feed a hidden-state queue, the drafter trains from it.
    Train(TrainArgs),
    /// Pretrain a small Qwen3 target as a plain next-token language model of a text corpus.
    PretrainTarget(PretrainArgs),
    /// Learn a byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json) from a text corpus.
    #[command(after_help = TOKENIZER_HELP)]
    TrainTokenizer(TokenizerArgs),
    /// Tokenize a data file once into a token file that `train --data` reads without tokenizing.
    #[command(after_help = PREPARE_HELP)]
    PrepareData(PrepareArgs),
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// TOML file with any training settings; flags and --set override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Override any setting: `--set key=value` (value in TOML syntax), repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Target checkpoint directory (Hugging Face layout; llama, qwen2 or qwen3, by its config.json model_type). Default: the embedded tiny target.
    #[arg(long, value_name = "DIR")]
    pub target: Option<PathBuf>,
    /// Random-weight target of a named shape instead of a checkpoint: `realistic` or `tiny`.
    #[arg(long, value_name = "NAME")]
    pub target_preset: Option<String>,
    /// Training data: plain text, JSONL (`input_ids`, `text`, `messages` or `conversations` records) or a token file from `prepare-data`. Default: the embedded corpus.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Tokenizer of text data: a tokenizer.json, or a directory with it and tokenizer_config.json (chat template). Default: the target's tokenizer.json, else bytes.
    #[arg(long, value_name = "DIR_OR_FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Optimizer steps (default 150).
    #[arg(long)]
    pub steps: Option<i64>,
    /// Devices of the target workers, comma-separated, one worker each (default cpu).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub target_devices: Option<Vec<String>>,
    /// Device of the drafter worker (default cpu).
    #[arg(long, value_name = "DEVICE")]
    pub drafter_device: Option<String>,
    /// Record a Chrome/Perfetto trace to RUN_DIR/trace.json; RUN_DIR is also the run directory.
    #[arg(long, value_name = "RUN_DIR")]
    pub trace: Option<PathBuf>,
    /// Run directory for the effective config, metrics, checkpoints and drafter (default runs/train-<time>).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Traced steps as a half-open window `a..b` (default: a short window after warm-up).
    #[arg(long, value_name = "A..B")]
    pub trace_steps: Option<String>,
    /// Write trace.json.gz instead of trace.json.
    #[arg(long)]
    pub trace_gzip: bool,
    /// With --trace on CUDA: record every kernel, copy and set of the traced window, and
    /// the CUDA calls that launch, wait or allocate, into the trace (CUPTI).
    #[arg(long, requires = "trace")]
    pub trace_kernels: bool,
    /// Continue the run in the run directory from its latest checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// Save a checkpoint and stop after this many steps (the LR schedule still spans --steps).
    #[arg(long, value_name = "N")]
    pub stop_after: Option<i64>,
    /// No progress lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct PretrainArgs {
    /// Plain-text corpus (UTF-8); the model holds out its last 5% of tokens for the held-out loss.
    #[arg(long, value_name = "FILE")]
    pub corpus: PathBuf,
    /// Output checkpoint directory (written atomically: config.json, model.safetensors and the tokenizer's files; anything else in it is replaced).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Tokenizer of the corpus: a tokenizer.json, or a directory with it and tokenizer_config.json; the model's vocab_size becomes its size. Default: the byte-level tokenizer (vocabulary 260).
    #[arg(long, value_name = "DIR_OR_FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Optimizer steps (default 800).
    #[arg(long, default_value_t = 800)]
    pub steps: i64,
    /// Sequences per batch (default 16).
    #[arg(long, default_value_t = 16)]
    pub batch: i64,
    /// Tokens per sequence (default 128).
    #[arg(long, default_value_t = 128)]
    pub seq_len: i64,
    /// Peak learning rate (default 3e-3).
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    /// Random seed (default 0).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Model shape preset (default tiny: 6 layers, hidden 128; its vocabulary is the tokenizer's, 260 for bytes).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
}

const TOKENIZER_HELP: &str = "\
GPT-2 / Qwen style: the text is split by the GPT-2 pattern and every byte is a symbol, so
any text encodes. Ids 0-3 are <|bos|>, <|eos|>, <|mask|>, <|pad|> (named in
tokenizer_config.json), 4-259 the bytes, then the merges. The same corpus and settings
give the same files, byte for byte.

Example (the tokenizer of fixtures/tiny-target-bpe):
  dflash train-tokenizer --corpus fixtures/corpus/train.txt --vocab-size 512 --out tok
  dflash pretrain-target --corpus fixtures/corpus/train.txt --tokenizer tok --out fixtures/tiny-target-bpe";

#[derive(Debug, Args)]
pub struct TokenizerArgs {
    /// Plain-text corpus (UTF-8) to learn the merges from.
    #[arg(long, value_name = "FILE")]
    pub corpus: PathBuf,
    /// Vocabulary size: 4 special tokens, 256 bytes, then merges, so at least 261 (default 512). A corpus with too few pairs left gives fewer.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub vocab_size: usize,
    /// Directory to write tokenizer.json and tokenizer_config.json into, each atomically (created if missing; other files in it are kept).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Fraction at the end of the corpus left out, cut at a line start: the part `train` and `pretrain-target` hold out for evaluation (default 0.05).
    #[arg(long, value_name = "F", default_value_t = 0.05)]
    pub heldout_fraction: f64,
}

const PREPARE_HELP: &str = "\
Formats, detected per file: plain text; JSONL of {\"text\": ...}, of chats
({\"messages\": [{\"role\", \"content\"}]} or ShareGPT {\"conversations\": [{\"from\", \"value\"}]},
rendered with the target's chat template, loss on the assistant's tokens only) or of token
ids ({\"input_ids\", \"loss_mask\"}). Conversations with no assistant turn are skipped and counted.

Example:
  dflash prepare-data --target ckpt/Qwen3-8B --data chats.jsonl --out chats.tok
  dflash train --target ckpt/Qwen3-8B --data chats.tok --target-devices cuda:0 --drafter-device cuda:0";

#[derive(Debug, Args)]
pub struct PrepareArgs {
    /// The data file to tokenize (any format `train --data` reads, but a token file).
    #[arg(long, value_name = "FILE")]
    pub data: PathBuf,
    /// The token file to write (atomically: a temporary file, then a rename).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Target checkpoint directory: its vocabulary size, and its tokenizer.json by default. Default: the embedded tiny target.
    #[arg(long, value_name = "DIR")]
    pub target: Option<PathBuf>,
    /// Tokenizer: a tokenizer.json, or a directory with it and tokenizer_config.json (chat template). Default: the target's tokenizer.json, else bytes.
    #[arg(long, value_name = "DIR_OR_FILE")]
    pub tokenizer: Option<PathBuf>,
}

#[cfg_attr(not(test), allow(dead_code))]
pub fn build_command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_is_well_formed() {
        super::build_command().debug_assert();
    }
}
