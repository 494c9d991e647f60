//! `dflash prepare-data` throughput and peak memory, without criterion:
//!
//! ```sh
//! cargo run --release --example prepare_data_bench            # 1 GiB generated JSONL
//! DFLASH_BENCH_JSONL_MB=64 cargo run --example prepare_data_bench
//! ```
//!
//! Cases, each in a child process of its own so its peak RSS (`VmHWM`) is its own:
//!
//! - `corpus-bytes`: the bundled corpus (`fixtures/corpus/train.txt`, plain text) with the
//!   byte tokenizer;
//! - `corpus-bpe`: the same with a byte-level BPE of 8192 ids trained on it (in the bench);
//! - `chat-jsonl`: a JSONL of OpenAI-style conversations built from the corpus's
//!   paragraphs (1 to 3 exchanges, a system turn in every third), `DFLASH_BENCH_JSONL_MB`
//!   MiB of it (default 1024), rendered with a Qwen2.5-style chat template and tokenized
//!   with that BPE, the loss on the assistant's tokens;
//! - `text-bpe`: plain text, the corpus repeated to `DFLASH_BENCH_TEXT_MB` MiB (default
//!   64), with that BPE;
//! - `read-token-file`: opening (and checking) the chat case's token file and decoding
//!   every record, as training does.
//!
//! Everything is written to a temporary directory that is removed at the end.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use dflash::train::pipeline::default_corpus;
use dflash::train::prepare::prepare;
use dflash::train::token_file::TokenFile;
use dflash::train::tokenizer::{HfTokenizer, Tokenizer};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

const TEMPLATE: &str = "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// Peak (`VmHWM`) or current (`VmRSS`) resident memory of this process, in MiB.
fn rss_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Trains a byte-level BPE on the corpus and saves it with the chat template into `dir`.
fn make_tokenizer(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_post_processor(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    let specials: Vec<AddedToken> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| AddedToken::from(*s, true))
        .collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(8192)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let corpus = default_corpus().display().to_string();
    tok.train_from_files(&mut trainer, vec![corpus]).unwrap();
    tok.save(dir.join("tokenizer.json"), false).unwrap();
    let cfg = serde_json::json!({
        "chat_template": TEMPLATE,
        "bos_token": null,
        "eos_token": "<|im_end|>",
    });
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
}

/// Writes about `mib` MiB of conversations made of the corpus's paragraphs.
fn make_jsonl(path: &Path, mib: u64) {
    let text = std::fs::read_to_string(default_corpus()).unwrap();
    let paras: Vec<&str> = text
        .split("\n\n")
        .map(str::trim)
        .filter(|p| p.len() > 40)
        .collect();
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let (mut written, mut i) = (0u64, 0usize);
    while written < mib << 20 {
        let mut msgs = Vec::new();
        if i % 3 == 0 {
            msgs.push(serde_json::json!({"role": "system", "content": "You are a concise Python expert."}));
        }
        for k in 0..1 + i % 3 {
            let p = paras[(i * 7 + k * 13) % paras.len()];
            let q = p.split(['.', '\n']).next().unwrap_or(p);
            msgs.push(serde_json::json!({"role": "user", "content": format!("Explain: {q}?")}));
            msgs.push(serde_json::json!({"role": "assistant", "content": p}));
        }
        let line = serde_json::json!({"messages": msgs, "id": i}).to_string();
        out.write_all(line.as_bytes()).unwrap();
        out.write_all(b"\n").unwrap();
        written += line.len() as u64 + 1;
        i += 1;
    }
    out.flush().unwrap();
}

/// Runs one case in this process and prints one result line.
fn run_case(case: &str, dir: &Path) {
    let bpe = || Tokenizer::Hf(Box::new(HfTokenizer::load(&dir.join("tokenizer")).unwrap()));
    let len = |p: &Path| std::fs::metadata(p).unwrap().len();
    let (input, tok) = match case {
        "corpus-bytes" => (default_corpus(), Tokenizer::Bytes),
        "corpus-bpe" => (default_corpus(), bpe()),
        "chat-jsonl" => (dir.join("chats.jsonl"), bpe()),
        "text-bpe" => (dir.join("text.txt"), bpe()),
        "read-token-file" => (dir.join("chat-jsonl.tok"), Tokenizer::Bytes),
        other => panic!("unknown case {other}"),
    };
    let start_rss = rss_mib("VmRSS:");
    let t0 = Instant::now();
    let tokens = if case == "read-token-file" {
        let f = TokenFile::open(&input).unwrap();
        f.records().map(|r| r.ids.len() as u64).sum()
    } else {
        let out = dir.join(format!("{case}.tok"));
        prepare(&input, &out, &tok, 1 << 20).unwrap().tokens
    };
    report(
        case,
        len(&input),
        tokens,
        t0.elapsed().as_secs_f64(),
        start_rss,
    );
}

/// One result line; the peak RSS also as its rise over the process before the case
/// (libtorch's libraries, loaded with the crate, make most of the start).
fn report(case: &str, bytes: u64, tokens: u64, secs: f64, start_rss: f64) {
    let peak = rss_mib("VmHWM:");
    println!(
        "{case:<16} {:>8.1} MiB {:>11} tokens {:>8.2} s {:>10.0} tokens/s {:>6.1} MiB/s  peak RSS {peak:>6.1} MiB (+{:.1} over the start)",
        bytes as f64 / (1 << 20) as f64,
        tokens,
        secs,
        tokens as f64 / secs,
        bytes as f64 / (1 << 20) as f64 / secs,
        peak - start_rss
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, case, dir] = &args[..] {
        if flag == "--case" {
            run_case(case, Path::new(dir));
            return;
        }
    }
    let mib: u64 = std::env::var("DFLASH_BENCH_JSONL_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let dir: PathBuf =
        std::env::temp_dir().join(format!("dflash-prepare-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t0 = Instant::now();
    make_tokenizer(&dir.join("tokenizer"));
    eprintln!(
        "trained the BPE (8192 ids) on the corpus in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    make_jsonl(&dir.join("chats.jsonl"), mib);
    eprintln!(
        "generated {mib} MiB of chat JSONL in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    println!(
        "dflash prepare-data bench, {} threads ({} build)",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let exe = std::env::current_exe().unwrap();
    let text_mib: u64 = std::env::var("DFLASH_BENCH_TEXT_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let corpus = std::fs::read_to_string(default_corpus()).unwrap();
    let times = (text_mib << 20).div_ceil(corpus.len() as u64) as usize;
    std::fs::write(dir.join("text.txt"), corpus.repeat(times)).unwrap();
    let cases = [
        "corpus-bytes",
        "corpus-bpe",
        "text-bpe",
        "chat-jsonl",
        "read-token-file",
    ];
    for case in cases {
        let status = Command::new(&exe)
            .args(["--case", case])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "{case} failed");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
