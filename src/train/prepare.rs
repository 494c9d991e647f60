//! `dflash prepare-data`: a data file tokenized once into a token file (`token_file`),
//! which `dflash train --data` then reads without tokenizing again. The records are the
//! ones training would make from the source (`records`), streamed to disk as they come,
//! so memory stays bounded by a batch of lines (plus 1/8 byte per token and 8 bytes per
//! record of the file's index).
use std::path::Path;

use super::records::{self, DataError, Format, Layout};
use super::token_file::{self, Writer};
use super::tokenizer::Tokenizer;

/// What a preparation wrote.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub format: Format,
    pub layout: Layout,
    pub records: u64,
    pub tokens: u64,
    /// Tokens with a loss weight.
    pub weighted: u64,
    /// One line each, naming the file: records skipped and why.
    pub warnings: Vec<String>,
}

/// Tokenizes `input` with `tok` into the token file `out` (written atomically). `vocab`
/// is the target's vocabulary size.
pub fn prepare(
    input: &Path,
    out: &Path,
    tok: &Tokenizer,
    vocab: i64,
) -> Result<Prepared, DataError> {
    let read_err = |source| DataError::Read {
        path: input.into(),
        source,
    };
    if token_file::is_token_file(input).map_err(read_err)? {
        return Err(DataError::Invalid {
            path: input.into(),
            message: "already a token file: pass it to dflash train --data".into(),
        });
    }
    let write_err = |source| DataError::Write {
        path: out.into(),
        source,
    };
    let mut writer = Writer::create(out).map_err(write_err)?;
    let mut weighted = 0u64;
    let summary = records::read(input, tok, vocab, &mut |r| {
        weighted += r.mask.iter().map(|&m| u64::from(m)).sum::<u64>();
        writer.push(&r.ids, &r.mask).map_err(write_err)
    })?;
    if summary.records == 0 {
        return Err(DataError::Invalid {
            path: input.into(),
            message: "no record has a token: there is nothing to train on".into(),
        });
    }
    let vocab_size = match summary.format {
        Format::TokenIds => vocab as u64,
        _ => tok.vocab_size() as u64,
    };
    let header = writer
        .finish(summary.layout, vocab_size)
        .map_err(write_err)?;
    Ok(Prepared {
        format: summary.format,
        layout: summary.layout,
        records: header.records,
        tokens: header.tokens,
        weighted,
        warnings: summary.warnings,
    })
}

/// The vocabulary size a checkpoint's `config.json` gives (`vocab_size`, or
/// `text_config.vocab_size`), whatever the model family.
pub fn target_vocab(dir: &Path) -> Result<i64, DataError> {
    let path = dir.join("config.json");
    let bad = |message: String| DataError::Invalid {
        path: path.clone(),
        message,
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| bad(format!("{e} (pass a checkpoint directory with --target)")))?;
    let cfg: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    cfg.get("vocab_size")
        .or_else(|| cfg.get("text_config")?.get("vocab_size"))
        .and_then(serde_json::Value::as_i64)
        .filter(|&v| v > 0)
        .ok_or_else(|| bad("no vocab_size".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::data;

    #[test]
    fn a_prepared_file_loads_to_the_sequences_of_its_source() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("c.jsonl");
        let rows = [
            "{\"input_ids\": [1, 2, 3, 4, 5], \"loss_mask\": [0, 0, 1, 1, 1]}",
            "{\"input_ids\": [7]}",
            "{\"input_ids\": [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11], \"loss_mask\": [1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]}",
        ];
        std::fs::write(&src, rows.join("\n")).unwrap();
        let out = d.path().join("c.tok");
        let p = prepare(&src, &out, &Tokenizer::Bytes, 12).unwrap();
        assert_eq!((p.records, p.tokens, p.weighted), (3, 17, 10));
        let a = data::load(&src, 8, 12, 0.0).unwrap();
        let b = data::load(&out, 8, 12, 0.0).unwrap();
        assert_eq!(a.train, b.train);
        assert_eq!(a.train.len(), 2);
        let e = data::load(&out, 8, 11, 0.0).unwrap_err().to_string();
        assert!(e.contains("prepared for a vocabulary of 12 ids"), "{e}");
        let e = prepare(&out, &d.path().join("x"), &Tokenizer::Bytes, 12).unwrap_err();
        assert!(e.to_string().contains("already a token file"), "{e}");
    }

    #[test]
    fn a_damaged_token_file_is_refused_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("t.txt");
        std::fs::write(&src, "some plain text, long enough to make windows\n").unwrap();
        let out = d.path().join("t.tok");
        prepare(&src, &out, &Tokenizer::Bytes, 260).unwrap();
        let good = std::fs::read(&out).unwrap();
        assert_eq!(&good[..8], b"DFLASHTK");
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..good.len() - 3].to_vec(), "truncated or corrupt"),
            (
                [&good[..8], &[9, 0, 0, 0], &good[12..]].concat(),
                "version 9",
            ),
            (
                [&good[..84], &[255, 255, 255, 255], &good[88..]].concat(),
                "a token id is not below vocab_size 260",
            ),
        ];
        for (bytes, needle) in cases {
            std::fs::write(&out, bytes).unwrap();
            let e = data::load(&out, 16, 260, 0.0).unwrap_err().to_string();
            assert!(
                e.contains("t.tok: bad token file: ") && e.contains(needle),
                "{e}"
            );
        }
    }
}
