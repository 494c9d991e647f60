//! The tokenizer that turns text data into the target's token ids: a Hugging Face
//! `tokenizer.json` (through the `tokenizers` crate) with what its `tokenizer_config.json`
//! says (the chat template, the special tokens: BOS, and the MASK and PAD ids the drafter
//! and the data loader use), or the byte-level tokenizer ([`bytes`], for targets that
//! come without a tokenizer, such as `fixtures/tiny-target`).
//!
//! Which one ([`resolve`]): `--tokenizer DIR_OR_FILE` (a directory holding
//! `tokenizer.json` and optionally `tokenizer_config.json` / `chat_template.jinja`, or a
//! `tokenizer.json` file, whose sibling `tokenizer_config.json` is read when present);
//! else the target checkpoint directory's `tokenizer.json` when it has one (as
//! `fixtures/tiny-target-bpe`, the embedded default's, has: a byte-level BPE made by
//! `dflash train-tokenizer`);
//! else the byte tokenizer. A tokenizer whose ids reach past the target's `vocab_size` is refused: it
//! is not the target's.
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::chat::ChatTemplate;

/// The byte-level tokenizer: ids 0..255 are bytes, then four special tokens.
pub mod bytes {
    pub const BOS: i64 = 256;
    pub const EOS: i64 = 257;
    pub const MASK: i64 = 258;
    pub const PAD: i64 = 259;
    pub const VOCAB: i64 = 260;

    pub fn encode(text: &str) -> Vec<i64> {
        text.bytes().map(i64::from).collect()
    }

    pub fn decode(ids: &[i64]) -> String {
        let b: Vec<u8> = ids
            .iter()
            .filter(|&&i| (0..256).contains(&i))
            .map(|&i| i as u8)
            .collect();
        String::from_utf8_lossy(&b).into_owned()
    }
}

/// A tokenizer that cannot be used, naming its file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct TokenizerError {
    pub path: PathBuf,
    pub message: String,
}

fn err(path: &Path, message: impl Into<String>) -> TokenizerError {
    TokenizerError {
        path: path.into(),
        message: message.into(),
    }
}

/// A Hugging Face tokenizer and what its configuration says.
#[derive(Debug)]
pub struct HfTokenizer {
    /// The `tokenizer.json` it was read from.
    pub path: PathBuf,
    inner: tokenizers::Tokenizer,
    /// One past the largest id.
    vocab: usize,
    bos: Option<u32>,
    /// `mask_token`'s id, when the configuration names one.
    mask: Option<u32>,
    /// `pad_token`'s id, when the configuration names one in the vocabulary.
    pad: Option<u32>,
    chat: Option<ChatTemplate>,
}

/// Text to token ids.
#[derive(Debug)]
pub enum Tokenizer {
    /// The byte-level tokenizer ([`bytes`]); no chat template.
    Bytes,
    Hf(Box<HfTokenizer>),
}

/// A special token of `tokenizer_config.json`: a string or `{"content": ...}`.
fn special(cfg: &Json, key: &str) -> Option<String> {
    match cfg.get(key)? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

/// The chat template source: `chat_template.jinja` beside the config, else the config's
/// `chat_template` (a string, or a list of named templates: the `default` one).
fn template_source(
    dir: &Path,
    cfg: &Json,
    cfg_path: &Path,
) -> Result<Option<String>, TokenizerError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|e| err(&jinja, e.to_string()));
    }
    Ok(match cfg.get("chat_template") {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(String::from)),
        Some(_) => {
            return Err(err(
                cfg_path,
                "chat_template is neither a string nor a list of named templates",
            ))
        }
    })
}

impl HfTokenizer {
    /// Reads `path`: a directory holding `tokenizer.json`, or the file itself.
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let (dir, file) = if path.is_dir() {
            (path.to_path_buf(), path.join("tokenizer.json"))
        } else {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (dir, path.to_path_buf())
        };
        if !file.is_file() {
            return Err(err(
                &file,
                "no such tokenizer file (pass a tokenizer.json or a directory holding one with --tokenizer)",
            ));
        }
        let inner = tokenizers::Tokenizer::from_file(&file).map_err(|e| {
            let e = e.to_string().replace('\n', " ");
            err(&file, format!("not a Hugging Face tokenizer.json: {e}"))
        })?;
        let vocab = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1);
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Json = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => {
                serde_json::from_str(&text).map_err(|e| err(&cfg_path, format!("not JSON: {e}")))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Json::Null,
            Err(e) => return Err(err(&cfg_path, e.to_string())),
        };
        let specials: BTreeMap<String, String> =
            ["bos_token", "eos_token", "pad_token", "unk_token"]
                .into_iter()
                .filter_map(|k| Some((k.to_string(), special(&cfg, k)?)))
                .collect();
        let add_bos = cfg.get("add_bos_token").and_then(Json::as_bool) != Some(false);
        let id_of = |key: &str, t: &str| {
            inner.token_to_id(t).ok_or_else(|| {
                err(
                    &cfg_path,
                    format!("{key} {t:?} is not in the tokenizer's vocabulary"),
                )
            })
        };
        let bos = match specials.get("bos_token").filter(|_| add_bos) {
            Some(t) => Some(id_of("bos_token", t)?),
            None => None,
        };
        let mask = special(&cfg, "mask_token")
            .map(|t| id_of("mask_token", &t))
            .transpose()?;
        // padding carries no loss weight and sits after every real token, so a pad_token
        // missing from the vocabulary (some configurations name one the model lacks)
        // only means the default pad id is used
        let pad = specials.get("pad_token").and_then(|t| inner.token_to_id(t));
        let chat = template_source(&dir, &cfg, &cfg_path)?
            .map(|src| ChatTemplate::new(&src, specials))
            .transpose()
            .map_err(|e| err(&cfg_path, e))?;
        Ok(Self {
            path: file,
            inner,
            vocab,
            bos,
            mask,
            pad,
            chat,
        })
    }

    /// The files it was read from, each with its name in a checkpoint directory:
    /// `tokenizer.json`, and the `tokenizer_config.json` and `chat_template.jinja` beside
    /// it where they exist.
    pub fn files(&self) -> Vec<(&'static str, PathBuf)> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let siblings = ["tokenizer_config.json", "chat_template.jinja"]
            .into_iter()
            .map(|name| (name, dir.join(name)))
            .filter(|(_, p)| p.is_file());
        std::iter::once(("tokenizer.json", self.path.clone()))
            .chain(siblings)
            .collect()
    }
}

impl Tokenizer {
    /// One past the largest id it produces.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Bytes => bytes::VOCAB as usize,
            Tokenizer::Hf(t) => t.vocab,
        }
    }

    /// The token each text sequence starts with (loss weight 0), if any.
    pub fn bos(&self) -> Option<u32> {
        match self {
            Tokenizer::Bytes => Some(bytes::BOS as u32),
            Tokenizer::Hf(t) => t.bos,
        }
    }

    /// The drafter's noise token as the configuration names it (`mask_token`). The byte
    /// tokenizer names none: its MASK is picked by the vocabulary's size, as for a
    /// tokenizer without one (`plan::special_ids`).
    pub fn mask(&self) -> Option<u32> {
        match self {
            Tokenizer::Bytes => None,
            Tokenizer::Hf(t) => t.mask,
        }
    }

    /// The token that pads a batch's shorter sequences as the configuration names it
    /// (`pad_token`, if the vocabulary has it); the byte tokenizer names none, as for
    /// [`Tokenizer::mask`].
    pub fn pad(&self) -> Option<u32> {
        match self {
            Tokenizer::Bytes => None,
            Tokenizer::Hf(t) => t.pad,
        }
    }

    pub fn chat(&self) -> Option<&ChatTemplate> {
        match self {
            Tokenizer::Bytes => None,
            Tokenizer::Hf(t) => t.chat.as_ref(),
        }
    }

    /// What it is, for messages: the byte tokenizer, or its file.
    pub fn describe(&self) -> String {
        match self {
            Tokenizer::Bytes => "the byte tokenizer".into(),
            Tokenizer::Hf(t) => t.path.display().to_string(),
        }
    }

    /// Token ids of `text` (special tokens written in the text are recognised; none are
    /// added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Tokenizer::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Tokenizer::Hf(t) => t
                .inner
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| format!("cannot tokenize: {e}")),
        }
    }

    /// Token ids of `text` with the byte range of `text` each one starts at.
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<usize>), String> {
        match self {
            Tokenizer::Bytes => Ok((
                text.bytes().map(u32::from).collect(),
                (0..text.len()).collect(),
            )),
            Tokenizer::Hf(t) => {
                let e = t
                    .inner
                    .encode(text, false)
                    .map_err(|e| format!("cannot tokenize: {e}"))?;
                let starts = e.get_offsets().iter().map(|o| o.0).collect();
                Ok((e.get_ids().to_vec(), starts))
            }
        }
    }
}

/// The loss mask of tokens that start at `starts` (byte offsets, ascending): 1 for a
/// token whose first byte lies in one of `spans` (ascending, disjoint).
pub fn mask_from_spans(starts: &[usize], spans: &[Range<usize>]) -> Vec<u8> {
    let mut k = 0;
    starts
        .iter()
        .map(|&s| {
            while k < spans.len() && spans[k].end <= s {
                k += 1;
            }
            (k < spans.len() && spans[k].contains(&s)) as u8
        })
        .collect()
}

/// The tokenizer of a run: `explicit` (`--tokenizer`), else `target_dir`'s
/// `tokenizer.json` when it has one, else the byte tokenizer. Refuses one whose ids
/// reach past the target's `vocab_size`.
pub fn resolve(
    explicit: Option<&Path>,
    target_dir: Option<&Path>,
    target_vocab: i64,
) -> Result<Tokenizer, TokenizerError> {
    let path = match (explicit, target_dir) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(d)) if d.join("tokenizer.json").is_file() => d.to_path_buf(),
        _ => return Ok(Tokenizer::Bytes),
    };
    let t = HfTokenizer::load(&path)?;
    if t.vocab as i64 > target_vocab {
        return Err(err(
            &t.path,
            format!(
                "the tokenizer's ids reach {} but the target's vocab_size is {target_vocab}: it is not the target's tokenizer (pass the target's own with --tokenizer)",
                t.vocab - 1
            ),
        ));
    }
    Ok(Tokenizer::Hf(Box::new(t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_masked_when_it_starts_inside_a_span() {
        let starts = [0, 2, 4, 5, 9, 12, 14];
        let m = mask_from_spans(&starts, &[3..9, 12..13]);
        assert_eq!(m, [0, 0, 1, 1, 0, 1, 0]);
        assert_eq!(mask_from_spans(&starts, &[]), [0; 7]);
    }

    #[test]
    fn the_configuration_names_the_bos_mask_and_pad_ids() {
        let d = tempfile::tempdir().unwrap();
        let t = super::super::bpe::train("def f(x):\n    return x\n", 270).unwrap();
        super::super::bpe::write(&t, d.path()).unwrap();
        let tok = resolve(None, Some(d.path()), 270).unwrap();
        assert_eq!(
            (tok.bos(), tok.mask(), tok.pad()),
            (Some(0), Some(2), Some(3))
        );
        assert_eq!(
            (Tokenizer::Bytes.mask(), Tokenizer::Bytes.pad()),
            (None, None)
        );
        // a mask_token the vocabulary lacks is refused; a missing pad_token is no pad id
        let cfg = d.path().join("tokenizer_config.json");
        let text = std::fs::read_to_string(&cfg).unwrap();
        std::fs::write(&cfg, text.replace("<|pad|>", "<pad>")).unwrap();
        assert_eq!(resolve(None, Some(d.path()), 270).unwrap().pad(), None);
        std::fs::write(&cfg, text.replace("<|mask|>", "<mask>")).unwrap();
        let e = resolve(None, Some(d.path()), 270).unwrap_err().to_string();
        assert!(
            e.contains(r#"mask_token "<mask>" is not in the tokenizer's vocabulary"#),
            "{e}"
        );
    }

    #[test]
    fn without_a_tokenizer_file_the_byte_tokenizer_is_used() {
        let d = tempfile::tempdir().unwrap();
        let t = resolve(None, Some(d.path()), 300).unwrap();
        assert!(matches!(t, Tokenizer::Bytes));
        let e = resolve(Some(&d.path().join("nope.json")), None, 300).unwrap_err();
        assert!(
            e.to_string().contains("nope.json: no such tokenizer file"),
            "{e}"
        );
        std::fs::write(d.path().join("tokenizer.json"), "{").unwrap();
        let e = resolve(None, Some(d.path()), 300).unwrap_err().to_string();
        assert!(
            e.contains("tokenizer.json: not a Hugging Face tokenizer.json"),
            "{e}"
        );
    }
}
