//! `dflash train-tokenizer`: a byte-level BPE tokenizer (GPT-2 / Qwen style: text is split
//! by the GPT-2 pattern and every byte is a symbol, so any text encodes without an
//! unknown token) learned from a plain-text corpus with the `tokenizers` crate's BPE
//! trainer, written as a Hugging Face `tokenizer.json` and a `tokenizer_config.json` that
//! names the special tokens the trainer uses ([`SPECIALS`]: BOS, EOS, MASK, PAD).
//!
//! The output is a pure function of the corpus and the settings: the trainer breaks ties
//! between equally frequent pairs by their ids, and both files are serialized with sorted
//! keys and ids, so the same input gives the same bytes.
use std::path::{Path, PathBuf};

use serde_json::json;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

/// The special tokens, ids 0..4 in this order: BOS, EOS, MASK (the drafter's noise
/// token), PAD.
pub const SPECIALS: [&str; 4] = ["<|bos|>", "<|eos|>", "<|mask|>", "<|pad|>"];

/// The vocabulary before any merge: the special tokens and the 256 bytes.
pub const BASE_VOCAB: usize = SPECIALS.len() + 256;

/// Why a tokenizer could not be trained or written; each names the flag or the file.
#[derive(Debug, thiserror::Error)]
pub enum BpeError {
    #[error("{}: cannot read the corpus: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: the corpus has no text to learn merges from (it is empty, or shorter than what --heldout-fraction leaves out)", path.display())]
    Empty { path: PathBuf },
    #[error("--vocab-size {0} is too small: the {n} special tokens and the 256 bytes take {BASE_VOCAB} ids, so it must be at least {min}", n = SPECIALS.len(), min = BASE_VOCAB + 1)]
    VocabTooSmall(usize),
    #[error("--heldout-fraction {0} is outside [0, 1)")]
    HeldoutFraction(f64),
    #[error("cannot train the tokenizer: {0}")]
    Train(String),
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A trained tokenizer, serialized.
#[derive(Debug, Clone)]
pub struct Trained {
    /// `tokenizer.json`.
    pub tokenizer_json: String,
    /// `tokenizer_config.json`.
    pub config_json: String,
    /// Its vocabulary size (less than asked for when the corpus has too few pairs left).
    pub vocab_size: usize,
    /// Merges learned.
    pub merges: usize,
    /// Bytes of corpus it was trained on.
    pub trained_bytes: usize,
}

/// The part of `text` a tokenizer learns from: all but the last `heldout_fraction` of
/// its bytes, cut at the start of a line (the part the trainers hold out for
/// evaluation should not shape the vocabulary).
pub fn training_part(text: &str, heldout_fraction: f64) -> &str {
    if heldout_fraction <= 0.0 {
        return text;
    }
    let at = ((text.len() as f64 * (1.0 - heldout_fraction)) as usize).min(text.len());
    // the last line start at or before `at`; in text of one line, the last character
    // boundary
    let line_start = (1..=at).rev().find(|&i| text.as_bytes()[i - 1] == b'\n');
    let cut = line_start.unwrap_or_else(|| {
        (0..=at)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0)
    });
    &text[..cut]
}

/// Learns a byte-level BPE of `vocab_size` ids (the specials, the bytes, then merges in
/// order of frequency) from `text`.
pub fn train(text: &str, vocab_size: usize) -> Result<Trained, BpeError> {
    if vocab_size <= BASE_VOCAB {
        return Err(BpeError::VocabTooSmall(vocab_size));
    }
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    // offsets are not trimmed: a token's start is where its first byte is, which the
    // chat loss mask relies on (tokenizer::mask_from_spans)
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
    tok.with_post_processor(Some(ByteLevel::new(false, false, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    let specials: Vec<AddedToken> = SPECIALS
        .iter()
        .map(|s| AddedToken::from(*s, true))
        .collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    tok.train(&mut trainer, std::iter::once(text))
        .map_err(|e| BpeError::Train(e.to_string()))?;
    for (id, s) in SPECIALS.iter().enumerate() {
        if tok.token_to_id(s) != Some(id as u32) {
            return Err(BpeError::Train(format!("{s} did not get id {id}")));
        }
    }
    let vocab_size = tok.get_vocab_size(true);
    let tokenizer_json = tok
        .to_string(true)
        .map_err(|e| BpeError::Train(e.to_string()))?;
    let [bos, eos, mask, pad] = SPECIALS;
    let config = json!({
        "add_bos_token": true,
        "bos_token": bos,
        "eos_token": eos,
        "mask_token": mask,
        "pad_token": pad,
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    let config_json = serde_json::to_string_pretty(&config).expect("a JSON value serializes");
    Ok(Trained {
        tokenizer_json: tokenizer_json + "\n",
        config_json: config_json + "\n",
        vocab_size,
        merges: vocab_size - BASE_VOCAB,
        trained_bytes: text.len(),
    })
}

/// Reads `corpus` and trains on all but its last `heldout_fraction` (see
/// [`training_part`]). Nothing is written.
pub fn train_file(
    corpus: &Path,
    vocab_size: usize,
    heldout_fraction: f64,
) -> Result<Trained, BpeError> {
    if !(0.0..1.0).contains(&heldout_fraction) {
        return Err(BpeError::HeldoutFraction(heldout_fraction));
    }
    if vocab_size <= BASE_VOCAB {
        return Err(BpeError::VocabTooSmall(vocab_size));
    }
    let text = std::fs::read_to_string(corpus).map_err(|source| BpeError::Read {
        path: corpus.into(),
        source,
    })?;
    let part = training_part(&text, heldout_fraction);
    if part.is_empty() {
        return Err(BpeError::Empty {
            path: corpus.into(),
        });
    }
    train(part, vocab_size)
}

/// Writes `out/tokenizer.json` and `out/tokenizer_config.json`, each atomically (a
/// temporary sibling, then a rename); other files in `out` are left alone, so a
/// checkpoint directory can take its tokenizer this way.
pub fn write(t: &Trained, out: &Path) -> Result<(), BpeError> {
    let werr = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BpeError::Write { path, source }
    };
    std::fs::create_dir_all(out).map_err(werr(out))?;
    for (name, text) in [
        ("tokenizer.json", &t.tokenizer_json),
        ("tokenizer_config.json", &t.config_json),
    ] {
        let path = out.join(name);
        crate::durable::write_file(&path, text.as_bytes()).map_err(werr(&path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "def f(x):\n    return x + 1\n\ndef g(y):\n    return y * 2\n";

    #[test]
    fn the_held_out_tail_is_cut_at_a_line_start() {
        let text = "aaaa\nbbbb\ncccc\ndddd\n";
        assert_eq!(training_part(text, 0.0), text);
        assert_eq!(training_part(text, 0.25), "aaaa\nbbbb\ncccc\n");
        assert_eq!(training_part(text, 0.3), "aaaa\nbbbb\n");
        assert_eq!(training_part("one line", 0.5), "one ");
        assert_eq!(training_part("ü", 0.4), "");
    }

    #[test]
    fn a_trained_tokenizer_round_trips_and_has_the_specials_first() {
        let t = train(TEXT, BASE_VOCAB + 20).unwrap();
        assert_eq!((t.vocab_size, t.merges), (BASE_VOCAB + 20, 20));
        let tok = tokenizers::Tokenizer::from_bytes(t.tokenizer_json.as_bytes()).unwrap();
        for (id, s) in SPECIALS.iter().enumerate() {
            assert_eq!(tok.token_to_id(s), Some(id as u32), "{s}");
        }
        let text = "return f(g(3)) # ünïcode\n";
        let enc = tok.encode(text, false).unwrap();
        // merges learned from TEXT shorten it; unseen bytes still encode
        assert!(enc.get_ids().len() < text.len(), "{:?}", enc.get_tokens());
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);
        // the offsets are byte offsets, not trimmed of the leading space: " f" (learned
        // from TEXT) starts at the space; the two bytes of a character share its start
        let starts: Vec<usize> = enc.get_offsets().iter().map(|o| o.0).collect();
        assert_eq!(starts[0], 0);
        assert!(starts.contains(&6) && !starts.contains(&7), "{starts:?}");
        assert!(starts.windows(2).all(|w| w[0] <= w[1]), "{starts:?}");
        let cfg: serde_json::Value = serde_json::from_str(&t.config_json).unwrap();
        assert_eq!(cfg["mask_token"], "<|mask|>");
    }

    #[test]
    fn the_same_corpus_gives_the_same_files() {
        let a = train(TEXT, BASE_VOCAB + 30).unwrap();
        let b = train(TEXT, BASE_VOCAB + 30).unwrap();
        assert_eq!(a.tokenizer_json, b.tokenizer_json);
        assert_eq!(a.config_json, b.config_json);
    }

    #[test]
    fn too_small_a_vocabulary_is_refused() {
        let e = train(TEXT, BASE_VOCAB).unwrap_err().to_string();
        assert!(e.contains("--vocab-size 260 is too small"), "{e}");
        assert!(e.contains("at least 261"), "{e}");
    }

    #[test]
    fn a_small_corpus_stops_short_of_the_vocabulary_asked_for() {
        let t = train("abab", 1000).unwrap();
        assert!(t.vocab_size < 1000 && t.merges >= 1, "{}", t.vocab_size);
    }
}
