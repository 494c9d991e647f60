//! Training data: a data file (plain text, text / chat / token-id JSONL, see
//! `records`; or a token file from `dflash prepare-data`, see `token_file`) read into
//! sequences, held-out split, bucketed into batches under a token budget, and served in
//! a seeded order that is a pure function of the position (so a resumed run continues at
//! exactly the batch it stopped at).
//!
//! Records become sequences the same way whichever path they came by (tokenized now, or
//! read from a token file), so a prepared file trains on exactly the batches its source
//! would: documents are truncated to `seq_len` (shorter than 2 tokens: dropped); a text
//! stream is cut into windows of `seq_len` (`seq_len - 1` tokens after the BOS, weight 0;
//! windows shorter than 8 tokens are dropped).
use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

pub use super::records::DataError;
use super::records::{self, Layout, Record};
use super::token_file::{self, TokenFile};
pub use super::tokenizer::bytes;
use super::tokenizer::Tokenizer;

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
    /// One line each, naming the file: records skipped while reading it.
    pub warnings: Vec<String>,
}

/// Cuts records into sequences (see the module header).
pub fn sequences(
    records: impl Iterator<Item = Record>,
    layout: Layout,
    seq_len: usize,
) -> Vec<Sequence> {
    let widen = |ids: &[u32], mask: &[u8]| Sequence {
        ids: ids.iter().map(|&t| i64::from(t)).collect(),
        mask: mask.iter().map(|&m| i64::from(m)).collect(),
    };
    match layout {
        Layout::Documents => records
            .filter(|r| r.ids.len() >= 2)
            .map(|r| {
                let n = r.ids.len().min(seq_len);
                widen(&r.ids[..n], &r.mask[..n])
            })
            .collect(),
        Layout::Stream { bos } => {
            let mut all = Record::default();
            for r in records {
                all.ids.extend_from_slice(&r.ids);
                all.mask.extend_from_slice(&r.mask);
            }
            let width = if bos.is_some() { seq_len - 1 } else { seq_len };
            all.ids
                .chunks(width)
                .zip(all.mask.chunks(width))
                .filter(|(c, _)| c.len() >= 8)
                .map(|(c, m)| {
                    let mut s = widen(c, m);
                    if let Some(b) = bos {
                        s.ids.insert(0, i64::from(b));
                        s.mask.insert(0, 0);
                    }
                    s
                })
                .collect()
        }
    }
}

/// Cuts byte-tokenized text into sequences of `seq_len` tokens, each starting with BOS.
pub fn text_sequences(text: &str, seq_len: usize) -> Vec<Sequence> {
    let ids: Vec<u32> = text.bytes().map(u32::from).collect();
    let mask = vec![1; ids.len()];
    let bos = Some(bytes::BOS as u32);
    sequences(
        std::iter::once(Record { ids, mask }),
        Layout::Stream { bos },
        seq_len,
    )
}

/// [`load_with`] the byte tokenizer (the embedded tiny target's).
pub fn load(
    path: &Path,
    seq_len: usize,
    vocab: i64,
    heldout_fraction: f64,
) -> Result<Dataset, DataError> {
    load_with(path, &Tokenizer::Bytes, seq_len, vocab, heldout_fraction)
}

/// Loads `path` (a token file, or any format of `records`, tokenized with `tok`) and
/// holds out the last `heldout_fraction` of its sequences.
pub fn load_with(
    path: &Path,
    tok: &Tokenizer,
    seq_len: usize,
    vocab: i64,
    heldout_fraction: f64,
) -> Result<Dataset, DataError> {
    let read_err = |source| DataError::Read {
        path: path.into(),
        source,
    };
    let (seqs, warnings) = if token_file::is_token_file(path).map_err(read_err)? {
        let file = TokenFile::open(path)?;
        let h = file.header();
        if h.vocab_size > vocab as u64 {
            return Err(DataError::Invalid {
                path: path.into(),
                message: format!(
                    "prepared for a vocabulary of {} ids, more than the target's vocab_size {vocab}: prepare it with the target's tokenizer",
                    h.vocab_size
                ),
            });
        }
        (sequences(file.records(), h.layout, seq_len), Vec::new())
    } else {
        let mut recs = Vec::new();
        let summary = records::read(path, tok, vocab, &mut |r| {
            recs.push(r);
            Ok(())
        })?;
        let seqs = sequences(recs.into_iter(), summary.layout, seq_len);
        (seqs, summary.warnings)
    };
    let mut data = split(seqs, heldout_fraction).ok_or_else(|| DataError::Invalid {
        path: path.into(),
        message: "no usable sequence (need at least 2 tokens per sequence)".into(),
    })?;
    data.warnings = warnings;
    Ok(data)
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
        warnings: Vec::new(),
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
        let e = load(&p, 16, 10, 0.0).unwrap_err().to_string();
        assert!(
            e.contains("d.jsonl:2") && e.contains("loss_mask has 1"),
            "{e}"
        );
        std::fs::write(&p, "{\"input_ids\": [1, 20]}\n").unwrap();
        let e = load(&p, 16, 10, 0.0).unwrap_err().to_string();
        assert!(e.contains("token id 20"), "{e}");
    }

    #[test]
    fn documents_are_truncated_and_streams_cut_into_windows_after_bos() {
        let rec = |n: u32| Record {
            ids: (0..n).collect(),
            mask: vec![1; n as usize],
        };
        let docs = sequences([rec(1), rec(5), rec(30)].into_iter(), Layout::Documents, 16);
        assert_eq!(docs.len(), 2);
        assert_eq!((docs[0].ids.len(), docs[1].ids.len()), (5, 16));
        let stream = sequences(
            [rec(20), rec(12)].into_iter(),
            Layout::Stream { bos: Some(99) },
            16,
        );
        // 32 tokens in windows of 15 after the BOS: 15, 15, then 2 (dropped)
        assert_eq!(stream.len(), 2);
        assert_eq!(stream[1].ids[..3], [99, 15, 16]);
        assert_eq!(stream[1].ids[5..8], [19, 0, 1]);
        assert_eq!(stream[0].mask[..2], [0, 1]);
        let plain = sequences([rec(20)].into_iter(), Layout::Stream { bos: None }, 10);
        assert_eq!(
            plain.iter().map(|s| s.ids.len()).collect::<Vec<_>>(),
            [10, 10]
        );
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
