//! Training data: JSONL token files or plain text through a byte-level tokenizer, cut into
//! sequences, held-out split, bucketed into batches under a token budget, and served in a
//! seeded order that is a pure function of the position (so a resumed run continues at
//! exactly the batch it stopped at).
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

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

/// A data problem, naming the file and line.
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
}

/// One training sequence: token ids and a 0/1 loss mask of the same length.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    pub ids: Vec<i64>,
    pub mask: Vec<i64>,
}

/// Sequences split into training and held-out parts.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub train: Vec<Sequence>,
    pub heldout: Vec<Sequence>,
}

#[derive(serde::Deserialize)]
struct JsonlRow {
    input_ids: Vec<i64>,
    #[serde(default)]
    loss_mask: Option<Vec<i64>>,
}

/// Reads JSONL rows `{"input_ids": [...], "loss_mask": [...]}`; sequences longer than
/// `seq_len` are truncated.
pub fn read_jsonl(path: &Path, seq_len: usize, vocab: i64) -> Result<Vec<Sequence>, DataError> {
    let file = std::fs::File::open(path).map_err(|source| DataError::Read {
        path: path.into(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| DataError::Read {
            path: path.into(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let at = |message: String| DataError::Line {
            path: path.into(),
            line: i + 1,
            message,
        };
        let row: JsonlRow = serde_json::from_str(&line).map_err(|e| at(format!("{e}")))?;
        let mask = row
            .loss_mask
            .unwrap_or_else(|| vec![1; row.input_ids.len()]);
        if mask.len() != row.input_ids.len() {
            return Err(at(format!(
                "loss_mask has {} entries, input_ids {}",
                mask.len(),
                row.input_ids.len()
            )));
        }
        if let Some(bad) = row.input_ids.iter().find(|&&t| t < 0 || t >= vocab) {
            return Err(at(format!(
                "token id {bad} is outside the target vocabulary 0..{vocab}"
            )));
        }
        if row.input_ids.len() < 2 {
            continue;
        }
        let n = row.input_ids.len().min(seq_len);
        out.push(Sequence {
            ids: row.input_ids[..n].to_vec(),
            mask: mask[..n].iter().map(|&m| (m != 0) as i64).collect(),
        });
    }
    Ok(out)
}

/// Cuts byte-tokenized text into sequences of `seq_len` tokens, each starting with BOS.
pub fn text_sequences(text: &str, seq_len: usize) -> Vec<Sequence> {
    let ids = bytes::encode(text);
    ids.chunks(seq_len - 1)
        .filter(|c| c.len() >= 8)
        .map(|c| {
            let mut s = Vec::with_capacity(c.len() + 1);
            s.push(bytes::BOS);
            s.extend_from_slice(c);
            let mut mask = vec![1; s.len()];
            mask[0] = 0;
            Sequence { ids: s, mask }
        })
        .collect()
}

/// Loads `path` (`.jsonl` or text) and holds out the last `heldout_fraction` of it.
pub fn load(
    path: &Path,
    seq_len: usize,
    vocab: i64,
    heldout_fraction: f64,
) -> Result<Dataset, DataError> {
    let is_jsonl = path
        .extension()
        .is_some_and(|e| e == "jsonl" || e == "json");
    let seqs = if is_jsonl {
        read_jsonl(path, seq_len, vocab)?
    } else {
        if vocab < bytes::VOCAB {
            return Err(DataError::Invalid {
                path: path.into(),
                message: format!(
                    "plain text uses the byte tokenizer (vocabulary {}), but the target's vocabulary is {vocab}; pass token ids as .jsonl",
                    bytes::VOCAB
                ),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| DataError::Read {
            path: path.into(),
            source,
        })?;
        text_sequences(&text, seq_len)
    };
    split(seqs, heldout_fraction).ok_or_else(|| DataError::Invalid {
        path: path.into(),
        message: "no usable sequence (need at least 2 tokens per sequence)".into(),
    })
}

/// Uniform random token sequences (for benchmarks at a given length).
pub fn synthetic(n: usize, seq_len: usize, vocab: i64, seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let seqs = (0..n)
        .map(|_| Sequence {
            ids: (0..seq_len)
                .map(|_| rand::Rng::gen_range(&mut rng, 0..vocab))
                .collect(),
            mask: vec![1; seq_len],
        })
        .collect();
    split(seqs, 0.0).expect("n > 0")
}

fn split(mut seqs: Vec<Sequence>, heldout_fraction: f64) -> Option<Dataset> {
    if seqs.is_empty() {
        return None;
    }
    let held = ((seqs.len() as f64 * heldout_fraction).round() as usize).min(seqs.len() - 1);
    let heldout = seqs.split_off(seqs.len() - held);
    Some(Dataset {
        train: seqs,
        heldout,
    })
}

/// Groups sequences of similar length into batches of at most `batch_tokens` padded
/// tokens. Returns indices into `seqs`.
pub fn plan_batches(seqs: &[Sequence], batch_tokens: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| (seqs[i].ids.len(), i));
    let mut batches = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    for i in order {
        // sorted by length, so the new one is the longest so far
        let longest = seqs[i].ids.len();
        if !cur.is_empty() && (cur.len() + 1) * longest > batch_tokens {
            batches.push(std::mem::take(&mut cur));
        }
        cur.push(i);
    }
    if !cur.is_empty() {
        batches.push(cur);
    }
    batches
}

/// A padded batch on the host.
pub struct HostBatch {
    pub input_ids: Tensor,
    pub loss_mask: Tensor,
    /// Global position of this batch in the data stream.
    pub index: u64,
}

/// Pads sequences to the longest with `pad` (loss mask 0 there).
pub fn collate(seqs: &[&Sequence], pad: i64, index: u64) -> HostBatch {
    let len = seqs.iter().map(|s| s.ids.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(seqs.len() * len);
    let mut mask = Vec::with_capacity(seqs.len() * len);
    for s in seqs {
        ids.extend_from_slice(&s.ids);
        ids.extend(std::iter::repeat_n(pad, len - s.ids.len()));
        mask.extend_from_slice(&s.mask);
        mask.extend(std::iter::repeat_n(0, len - s.ids.len()));
    }
    let shape = [seqs.len() as i64, len as i64];
    HostBatch {
        input_ids: Tensor::from_slice(&ids).view(shape),
        loss_mask: Tensor::from_slice(&mask).view(shape),
        index,
    }
}

/// Serves batches by global position: position `p` is batch `p % n` of epoch `p / n`, in
/// an order shuffled with `seed + epoch`.
pub struct Loader {
    seqs: Vec<Sequence>,
    batches: Vec<Vec<usize>>,
    seed: u64,
    pad: i64,
    epoch_order: Option<(u64, Vec<usize>)>,
    pub position: u64,
}

impl Loader {
    pub fn new(
        seqs: Vec<Sequence>,
        batch_tokens: usize,
        seed: u64,
        pad: i64,
        position: u64,
    ) -> Self {
        let batches = plan_batches(&seqs, batch_tokens);
        Self {
            seqs,
            batches,
            seed,
            pad,
            epoch_order: None,
            position,
        }
    }

    pub fn batches_per_epoch(&self) -> usize {
        self.batches.len()
    }

    /// The batch at the current position; advances the position.
    pub fn next_batch(&mut self) -> HostBatch {
        let n = self.batches.len() as u64;
        let (epoch, i) = (self.position / n, (self.position % n) as usize);
        if self.epoch_order.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let mut order: Vec<usize> = (0..self.batches.len()).collect();
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(
                self.seed.wrapping_add(epoch),
            ));
            self.epoch_order = Some((epoch, order));
        }
        let b = self.epoch_order.as_ref().expect("just set").1[i];
        let seqs: Vec<&Sequence> = self.batches[b].iter().map(|&j| &self.seqs[j]).collect();
        let batch = collate(&seqs, self.pad, self.position);
        self.position += 1;
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: usize) -> Sequence {
        Sequence {
            ids: vec![1; n],
            mask: vec![1; n],
        }
    }

    #[test]
    fn batches_respect_the_budget_and_cover_everything_once() {
        let seqs: Vec<Sequence> = [5, 9, 3, 12, 7, 7, 2, 11].iter().map(|&n| seq(n)).collect();
        let batches = plan_batches(&seqs, 24);
        let mut seen: Vec<usize> = batches.concat();
        seen.sort();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        for b in &batches {
            let longest = b.iter().map(|&i| seqs[i].ids.len()).max().unwrap();
            assert!(b.len() * longest <= 24 || b.len() == 1, "{b:?}");
        }
    }

    #[test]
    fn loader_order_is_a_function_of_position() {
        let seqs: Vec<Sequence> = (0..20)
            .map(|i| Sequence {
                ids: vec![i; 4],
                mask: vec![1; 4],
            })
            .collect();
        let mut a = Loader::new(seqs.clone(), 8, 3, 0, 0);
        let first: Vec<Vec<i64>> = (0..15)
            .map(|_| Vec::try_from(a.next_batch().input_ids.view([-1])).unwrap())
            .collect();
        let mut b = Loader::new(seqs, 8, 3, 0, 7);
        let rest: Vec<Vec<i64>> = (7..15)
            .map(|_| Vec::try_from(b.next_batch().input_ids.view([-1])).unwrap())
            .collect();
        assert_eq!(first[7..], rest[..]);
        assert_ne!(
            first[..10],
            first[10..15]
                .iter()
                .chain(&first[..5])
                .cloned()
                .collect::<Vec<_>>()[..]
        );
    }

    #[test]
    fn collate_pads_with_zero_loss_mask() {
        let a = Sequence {
            ids: vec![1, 2, 3],
            mask: vec![0, 1, 1],
        };
        let b = Sequence {
            ids: vec![4, 5],
            mask: vec![1, 1],
        };
        let batch = collate(&[&a, &b], 9, 0);
        assert_eq!(
            Vec::<i64>::try_from(batch.input_ids.view([-1])).unwrap(),
            vec![1, 2, 3, 4, 5, 9]
        );
        assert_eq!(
            Vec::<i64>::try_from(batch.loss_mask.view([-1])).unwrap(),
            vec![0, 1, 1, 1, 1, 0]
        );
    }

    #[test]
    fn jsonl_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.jsonl");
        std::fs::write(
            &p,
            "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [1, 2], \"loss_mask\": [1]}\n",
        )
        .unwrap();
        let e = read_jsonl(&p, 16, 10).unwrap_err().to_string();
        assert!(
            e.contains("d.jsonl:2") && e.contains("loss_mask has 1"),
            "{e}"
        );
        std::fs::write(&p, "{\"input_ids\": [1, 20]}\n").unwrap();
        let e = read_jsonl(&p, 16, 10).unwrap_err().to_string();
        assert!(e.contains("token id 20"), "{e}");
    }

    #[test]
    fn byte_tokenizer_round_trips() {
        let t = "héllo, world\n";
        assert_eq!(bytes::decode(&bytes::encode(t)), t);
        let s = text_sequences(&"abcdefghij".repeat(10), 16);
        assert!(s
            .iter()
            .all(|q| q.ids[0] == bytes::BOS && q.mask[0] == 0 && q.ids.len() <= 16));
    }
}
