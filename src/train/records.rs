//! A data file read into token records (ids and a 0/1 loss mask each), in file order:
//! the format is detected once per file, then every record is tokenized (JSONL lines in
//! parallel batches, results kept in order).
//!
//! Formats ([`detect`]; a token file, see `token_file`, is recognised before this):
//!
//! - **JSONL**, when the extension is `.jsonl` / `.json` or the first non-blank line is a
//!   JSON object. Its first record decides the kind, and every record must be of it:
//!   - `{"input_ids": [...], "loss_mask": [...]}`: token ids, the mask optional (all 1);
//!   - `{"text": "..."}`: a document, tokenized, after the tokenizer's BOS (weight 0);
//!   - `{"messages": [{"role", "content"}, ...]}` (OpenAI) and
//!     `{"conversations": [{"from", "value"}, ...]}` (ShareGPT: `human`/`user`,
//!     `gpt`/`assistant`, `system`, `tool`), rendered with the target's chat template and
//!     tokenized once; the loss mask is 1 on the assistant turns' tokens only (how they
//!     are found: `chat`'s module header; a token is the assistant's when its first byte
//!     is). A conversation with no assistant turn is skipped and counted.
//! - **Plain text** otherwise: one stream of tokens (the file in blocks of about 256 KiB cut
//!   at line ends, each tokenized on its own), cut into windows at load time.
//!
//! Documents and conversations are truncated to `seq_len` at load time; a stream is cut
//! into windows of `seq_len`, each after the BOS (see `data`).
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde_json::Value as Json;

use super::chat::role;
use super::tokenizer::{bytes, mask_from_spans, Tokenizer};

/// A data problem, naming the file (and the line, where there is one).
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(
        "cannot read data {path}: {source} (pass an existing .jsonl or text file with --data)"
    )]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One record: token ids and a 0/1 loss mask of the same length.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record {
    pub ids: Vec<u32>,
    pub mask: Vec<u8>,
}

/// How records become training sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Each record is a sequence, truncated to `seq_len`; shorter than 2 tokens: dropped.
    Documents,
    /// The records are one stream of tokens, cut into windows of `seq_len`, each after
    /// `bos` (weight 0) when there is one.
    Stream { bos: Option<u32> },
}

/// The format of a data file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    PlainText,
    TokenIds,
    Text,
    Messages,
    ShareGpt,
}

impl Format {
    pub fn describe(self) -> &'static str {
        match self {
            Format::PlainText => "plain text",
            Format::TokenIds => "token-id JSONL",
            Format::Text => "text JSONL",
            Format::Messages => "OpenAI chat JSONL",
            Format::ShareGpt => "ShareGPT chat JSONL",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Format::PlainText => "",
            Format::TokenIds => "input_ids",
            Format::Text => "text",
            Format::Messages => "messages",
            Format::ShareGpt => "conversations",
        }
    }
}

/// What reading a file gave.
#[derive(Debug, Clone)]
pub struct Summary {
    pub format: Format,
    pub layout: Layout,
    pub records: usize,
    /// One line each, naming the file: records skipped and why.
    pub warnings: Vec<String>,
}

#[derive(serde::Deserialize)]
struct Row {
    input_ids: Option<Vec<i64>>,
    loss_mask: Option<Vec<i64>>,
    text: Option<String>,
    messages: Option<Vec<Json>>,
    conversations: Option<Vec<ShareGptTurn>>,
}

#[derive(serde::Deserialize)]
struct ShareGptTurn {
    from: String,
    value: String,
}

impl Row {
    fn format(&self) -> Option<Format> {
        if self.input_ids.is_some() {
            Some(Format::TokenIds)
        } else if self.messages.is_some() {
            Some(Format::Messages)
        } else if self.conversations.is_some() {
            Some(Format::ShareGpt)
        } else {
            self.text.is_some().then_some(Format::Text)
        }
    }
}

fn read_err(path: &Path) -> impl Fn(std::io::Error) -> DataError + '_ {
    move |source| DataError::Read {
        path: path.into(),
        source,
    }
}

fn line_err(path: &Path, line: usize, message: impl Into<String>) -> DataError {
    DataError::Line {
        path: path.into(),
        line,
        message: message.into(),
    }
}

/// The file's format and the line of its first record. An empty (or blank) file is an
/// error.
pub fn detect(path: &Path) -> Result<(Format, usize), DataError> {
    let file = File::open(path).map_err(read_err(path))?;
    let jsonl_ext = path
        .extension()
        .is_some_and(|e| e == "jsonl" || e == "json");
    let mut r = BufReader::new(file);
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        buf.clear();
        if r.read_until(b'\n', &mut buf).map_err(read_err(path))? == 0 {
            return Err(DataError::Invalid {
                path: path.into(),
                message: "the file is empty: there is nothing to train on".into(),
            });
        }
        line += 1;
        let t = buf.trim_ascii();
        if t.is_empty() {
            continue;
        }
        if !jsonl_ext && !t.starts_with(b"{") {
            return Ok((Format::PlainText, line));
        }
        return match serde_json::from_slice::<Row>(t) {
            Ok(row) => row.format().map(|f| (f, line)).ok_or_else(|| {
                line_err(path, line, "a JSONL record needs input_ids, text, messages (OpenAI chat) or conversations (ShareGPT)")
            }),
            Err(e) if jsonl_ext => Err(line_err(path, line, e.to_string())),
            Err(_) => Ok((Format::PlainText, line)),
        };
    }
}

/// Reads `path` (not a token file), calling `sink` with every record in file order.
/// `vocab` is the target's vocabulary size (token ids must be below it).
pub fn read(
    path: &Path,
    tok: &Tokenizer,
    vocab: i64,
    sink: &mut dyn FnMut(Record) -> Result<(), DataError>,
) -> Result<Summary, DataError> {
    let (format, first) = detect(path)?;
    if format != Format::TokenIds && tok.vocab_size() as i64 > vocab {
        let message = match tok {
            Tokenizer::Bytes => format!(
                "text data uses the byte tokenizer (vocabulary {}), but the target's vocabulary is {vocab}: pass the target's tokenizer with --tokenizer, or token ids as .jsonl",
                bytes::VOCAB
            ),
            Tokenizer::Hf(_) => format!(
                "the tokenizer {} has {} ids, more than the target's vocabulary {vocab}",
                tok.describe(),
                tok.vocab_size()
            ),
        };
        return Err(DataError::Invalid {
            path: path.into(),
            message,
        });
    }
    if matches!(format, Format::Messages | Format::ShareGpt) && tok.chat().is_none() {
        return Err(line_err(path, first, format!(
            "chat records need the target's chat template, and {} has none: pass --tokenizer with a tokenizer_config.json that has chat_template",
            tok.describe()
        )));
    }
    let mut summary = Summary {
        format,
        layout: Layout::Documents,
        records: 0,
        warnings: Vec::new(),
    };
    let mut count = |r: Record| {
        summary.records += 1;
        sink(r)
    };
    if format == Format::PlainText {
        read_text(path, tok, &mut count)?;
        summary.layout = Layout::Stream { bos: tok.bos() };
        return Ok(summary);
    }
    let skipped = read_jsonl(path, format, tok, vocab, &mut count)?;
    if let Some((n, line)) = skipped {
        if summary.records == 0 {
            return Err(line_err(path, line, format!(
                "the conversation has no assistant turn, and neither has any other ({n} skipped): there is nothing to train on"
            )));
        }
        summary.warnings.push(format!(
            "{}: skipped {n} conversation(s) with no assistant turn (the first at line {line}): they have nothing to train on",
            path.display()
        ));
    }
    Ok(summary)
}

/// Lines per parallel batch, and bytes.
const BATCH_LINES: usize = 4096;
const BATCH_BYTES: usize = 8 << 20;

/// Reads JSONL records in parallel batches; returns the count of skipped conversations
/// and the line of the first.
fn read_jsonl(
    path: &Path,
    format: Format,
    tok: &Tokenizer,
    vocab: i64,
    sink: &mut dyn FnMut(Record) -> Result<(), DataError>,
) -> Result<Option<(usize, usize)>, DataError> {
    let file = File::open(path).map_err(read_err(path))?;
    let mut r = BufReader::with_capacity(1 << 20, file);
    let (mut line, mut eof) = (0, false);
    let mut skipped: Option<(usize, usize)> = None;
    while !eof {
        let mut batch: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut bytes = 0;
        while batch.len() < BATCH_LINES && bytes < BATCH_BYTES {
            let mut buf = Vec::new();
            if r.read_until(b'\n', &mut buf).map_err(read_err(path))? == 0 {
                eof = true;
                break;
            }
            line += 1;
            bytes += buf.len();
            if !buf.trim_ascii().is_empty() {
                batch.push((line, buf));
            }
        }
        let done: Vec<Result<Option<Record>, DataError>> = batch
            .par_iter()
            .map(|(n, l)| json_record(l, format, tok, vocab).map_err(|m| line_err(path, *n, m)))
            .collect();
        for ((n, _), rec) in batch.iter().zip(done) {
            match rec? {
                Some(rec) => sink(rec)?,
                None => {
                    let s = skipped.get_or_insert((0, *n));
                    s.0 += 1;
                }
            }
        }
    }
    Ok(skipped)
}

/// One JSONL line as a record; `None`: a conversation with no assistant turn.
fn json_record(
    line: &[u8],
    format: Format,
    tok: &Tokenizer,
    vocab: i64,
) -> Result<Option<Record>, String> {
    let row: Row = serde_json::from_slice(line.trim_ascii()).map_err(|e| e.to_string())?;
    if row.format() != Some(format) {
        return Err(format!(
            "no `{}`: every record of this file must be {} like its first",
            format.key(),
            format.describe()
        ));
    }
    match format {
        Format::TokenIds => token_ids(row, vocab).map(Some),
        Format::Text => {
            let ids = tok.encode(row.text.as_deref().unwrap_or_default())?;
            Ok(Some(with_bos(tok.bos(), ids)))
        }
        Format::Messages => {
            let msgs = row.messages.unwrap_or_default();
            for (k, m) in msgs.iter().enumerate() {
                if role(m).is_none() {
                    return Err(format!("message {k} has no string `role`"));
                }
            }
            conversation(&msgs, tok)
        }
        Format::ShareGpt => {
            let msgs = row
                .conversations
                .unwrap_or_default()
                .into_iter()
                .map(|t| {
                    let role = match t.from.as_str() {
                        "human" | "user" => "user",
                        "gpt" | "assistant" => "assistant",
                        "system" => "system",
                        "tool" => "tool",
                        other => {
                            return Err(format!(
                            "unknown ShareGPT speaker {other:?}: use human, gpt, system or tool"
                        ))
                        }
                    };
                    Ok(serde_json::json!({"role": role, "content": t.value}))
                })
                .collect::<Result<Vec<_>, _>>()?;
            conversation(&msgs, tok)
        }
        Format::PlainText => unreachable!("plain text is not JSONL"),
    }
}

fn token_ids(row: Row, vocab: i64) -> Result<Record, String> {
    let ids = row.input_ids.unwrap_or_default();
    let mask = row.loss_mask.unwrap_or_else(|| vec![1; ids.len()]);
    if mask.len() != ids.len() {
        return Err(format!(
            "loss_mask has {} entries, input_ids {}",
            mask.len(),
            ids.len()
        ));
    }
    if let Some(bad) = ids.iter().find(|&&t| t < 0 || t >= vocab) {
        return Err(format!(
            "token id {bad} is outside the target vocabulary 0..{vocab}"
        ));
    }
    Ok(Record {
        ids: ids.into_iter().map(|t| t as u32).collect(),
        mask: mask.into_iter().map(|m| (m != 0) as u8).collect(),
    })
}

fn with_bos(bos: Option<u32>, ids: Vec<u32>) -> Record {
    let mut out = Record::default();
    out.ids.extend(bos);
    out.mask.extend(bos.map(|_| 0));
    out.mask.resize(out.ids.len() + ids.len(), 1);
    out.ids.extend(ids);
    out
}

/// A conversation rendered with the chat template and tokenized; the loss mask on the
/// assistant turns. `None` when it has no assistant turn.
pub fn conversation(messages: &[Json], tok: &Tokenizer) -> Result<Option<Record>, String> {
    if !messages.iter().any(|m| role(m) == Some("assistant")) {
        return Ok(None);
    }
    let chat = tok.chat().ok_or("the tokenizer has no chat template")?;
    let r = chat.render_spans(messages)?;
    let (ids, starts) = tok.encode_with_offsets(&r.text)?;
    let mask = mask_from_spans(&starts, &r.spans);
    Ok(Some(Record { ids, mask }))
}

/// Bytes per plain-text block (a block's tokenization takes tens of times its size while
/// it runs), and blocks per parallel batch.
const BLOCK_BYTES: usize = 256 << 10;
const BATCH_BLOCKS: usize = 64;

/// Reads plain text in blocks cut at line ends, tokenized in parallel, one record each.
fn read_text(
    path: &Path,
    tok: &Tokenizer,
    sink: &mut dyn FnMut(Record) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let file = File::open(path).map_err(read_err(path))?;
    let mut r = BufReader::with_capacity(1 << 20, file);
    let (mut line, mut eof) = (1, false);
    while !eof {
        let mut blocks: Vec<(usize, Vec<u8>)> = Vec::new();
        while blocks.len() < BATCH_BLOCKS && !eof {
            let mut block = Vec::with_capacity(BLOCK_BYTES + 4096);
            (&mut r)
                .take(BLOCK_BYTES as u64)
                .read_to_end(&mut block)
                .map_err(read_err(path))?;
            eof = block.len() < BLOCK_BYTES;
            if !eof {
                r.read_until(b'\n', &mut block).map_err(read_err(path))?;
            }
            let lines = block.iter().filter(|&&b| b == b'\n').count();
            blocks.push((line, block));
            line += lines;
        }
        let done: Vec<Result<Vec<u32>, DataError>> = blocks
            .par_iter()
            .map(|(first, b)| {
                let text = std::str::from_utf8(b).map_err(|e| {
                    let at = first + b[..e.valid_up_to()].iter().filter(|&&c| c == b'\n').count();
                    line_err(path, at, "not UTF-8 text")
                })?;
                tok.encode(text).map_err(|m| line_err(path, *first, m))
            })
            .collect();
        for ids in done {
            let ids = ids?;
            if !ids.is_empty() {
                let mask = vec![1; ids.len()];
                sink(Record { ids, mask })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn the_format_is_detected_from_the_extension_and_the_first_record() {
        let d = tempfile::tempdir().unwrap();
        let cases = [
            ("a.txt", "hello\n{\"text\": 1}\n", Format::PlainText),
            ("b.txt", "\n\n{\"text\": \"x\"}\n", Format::Text),
            ("c.jsonl", "{\"input_ids\": [1]}\n", Format::TokenIds),
            ("d.data", "{\"messages\": []}\n", Format::Messages),
            (
                "e.jsonl",
                "{\"conversations\": [], \"id\": 3}\n",
                Format::ShareGpt,
            ),
            ("f.txt", "{ not json but text\n", Format::PlainText),
        ];
        for (name, text, want) in cases {
            assert_eq!(
                detect(&write(d.path(), name, text)).unwrap().0,
                want,
                "{name}"
            );
        }
        let e = detect(&write(d.path(), "g.jsonl", "\n{\"foo\": 1}\n")).unwrap_err();
        assert!(e.to_string().ends_with("g.jsonl:2: a JSONL record needs input_ids, text, messages (OpenAI chat) or conversations (ShareGPT)"), "{e}");
        let e = detect(&write(d.path(), "h.txt", " \n\n")).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("h.txt: the file is empty: there is nothing to train on"),
            "{e}"
        );
    }

    fn read_all(path: &Path, tok: &Tokenizer) -> Result<(Vec<Record>, Summary), DataError> {
        let mut out = Vec::new();
        let s = read(path, tok, 300, &mut |r| {
            out.push(r);
            Ok(())
        })?;
        Ok((out, s))
    }

    #[test]
    fn text_records_start_with_bos_and_records_must_share_the_kind() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "t.jsonl",
            "{\"text\": \"ab\"}\n\n{\"text\": \"c\", \"x\": 1}\n",
        );
        let (recs, s) = read_all(&p, &Tokenizer::Bytes).unwrap();
        assert_eq!(
            (s.format, s.layout, s.records),
            (Format::Text, Layout::Documents, 2)
        );
        assert_eq!(recs[0].ids, [256, 97, 98]);
        assert_eq!(recs[0].mask, [0, 1, 1]);
        let p = write(
            d.path(),
            "m.jsonl",
            "{\"text\": \"ab\"}\n{\"input_ids\": [1, 2]}\n",
        );
        let e = read_all(&p, &Tokenizer::Bytes).unwrap_err().to_string();
        assert!(
            e.contains("m.jsonl:2: no `text`: every record of this file must be text JSONL"),
            "{e}"
        );
        let p = write(
            d.path(),
            "c.jsonl",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n",
        );
        let e = read_all(&p, &Tokenizer::Bytes).unwrap_err().to_string();
        assert!(
            e.contains("c.jsonl:1: chat records need the target's chat template"),
            "{e}"
        );
    }

    #[test]
    fn plain_text_is_one_stream_in_blocks_cut_at_line_ends() {
        let d = tempfile::tempdir().unwrap();
        let line = "x".repeat(999) + "\n";
        let text = line.repeat(2500);
        let p = write(d.path(), "big.txt", &text);
        let (recs, s) = read_all(&p, &Tokenizer::Bytes).unwrap();
        assert_eq!(s.layout, Layout::Stream { bos: Some(256) });
        assert!(recs.len() >= 2, "{}", recs.len());
        let all: Vec<u32> = recs.iter().flat_map(|r| r.ids.iter().copied()).collect();
        assert_eq!(all, text.bytes().map(u32::from).collect::<Vec<_>>());
        assert!(recs.iter().all(|r| r.ids.last() == Some(&10)));
        let mut bad = text.into_bytes();
        bad.extend_from_slice(b"ok\n\xff\n");
        std::fs::write(&p, bad).unwrap();
        let e = read_all(&p, &Tokenizer::Bytes).unwrap_err().to_string();
        assert!(e.contains("big.txt:2502: not UTF-8 text"), "{e}");
    }
}
