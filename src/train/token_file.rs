//! The token file `dflash prepare-data` writes and `dflash train --data` reads without
//! tokenizing again: the records of a data file (token ids and loss mask), memory-mapped.
//!
//! Layout, all integers little-endian:
//!
//! ```text
//! offset  size  field
//!      0     8  magic "DFLASHTK"
//!      8     4  version (1)
//!     12     4  layout: 0 documents (each record a sequence), 1 stream (the records are
//!               one token stream cut into windows at load time)
//!     16     8  vocab_size: every id is below it
//!     24     8  bos: the id each window of a stream starts with, -1 for none (i64)
//!     32     8  records n
//!     40     8  tokens t
//!     48     8  ids_offset = 80: t ids, u32 each
//!     56     8  mask_offset = 80 + 4t: ceil(t/8) bytes, token j's loss weight is bit
//!               j % 8 (least significant first) of byte j / 8
//!     64     8  starts_offset: the mask's end rounded up to 8; n + 1 u64 token indices,
//!               record r is tokens starts[r]..starts[r + 1] (starts[0] = 0, starts[n] = t)
//!     72     8  file_len = starts_offset + 8 (n + 1)
//! ```
//!
//! It is written under a temporary sibling name while records stream in (the ids go
//! straight to disk; the mask bits and record starts are kept in memory, 1/8 byte per
//! token and 8 bytes per record), then the header is filled in, the file synced and
//! renamed into place. Opening checks the magic, the version, every offset against the
//! counts and the file's length, the record starts and every id against `vocab_size`.
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::records::{DataError, Layout, Record};
use crate::durable;

pub const MAGIC: &[u8; 8] = b"DFLASHTK";
pub const VERSION: u32 = 1;
const HEADER: u64 = 80;

/// What the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub layout: Layout,
    pub vocab_size: u64,
    pub records: u64,
    pub tokens: u64,
}

impl Header {
    fn mask_offset(&self) -> u64 {
        HEADER + 4 * self.tokens
    }

    fn starts_offset(&self) -> u64 {
        (self.mask_offset() + self.tokens.div_ceil(8)).next_multiple_of(8)
    }

    fn file_len(&self) -> u64 {
        self.starts_offset() + 8 * (self.records + 1)
    }

    fn to_bytes(self) -> Vec<u8> {
        let (layout, bos) = match self.layout {
            Layout::Documents => (0u32, -1i64),
            Layout::Stream { bos } => (1, bos.map_or(-1, i64::from)),
        };
        let mut b = Vec::with_capacity(HEADER as usize);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&layout.to_le_bytes());
        b.extend_from_slice(&self.vocab_size.to_le_bytes());
        b.extend_from_slice(&bos.to_le_bytes());
        for v in [
            self.records,
            self.tokens,
            HEADER,
            self.mask_offset(),
            self.starts_offset(),
            self.file_len(),
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// Whether `path` starts with the token file's magic.
pub fn is_token_file(path: &Path) -> io::Result<bool> {
    let mut head = [0u8; 8];
    let mut f = File::open(path)?;
    let mut got = 0;
    while got < 8 {
        match f.read(&mut head[got..])? {
            0 => return Ok(false),
            n => got += n,
        }
    }
    Ok(&head == MAGIC)
}

/// Writes a token file record by record; [`Writer::finish`] puts it in place.
pub struct Writer {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    mask: Vec<u8>,
    starts: Vec<u64>,
    tokens: u64,
}

impl Writer {
    pub fn create(path: &Path) -> io::Result<Self> {
        let tmp = durable::temp_sibling(path);
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        out.write_all(&[0; HEADER as usize])?;
        Ok(Self {
            path: path.into(),
            tmp,
            out: Some(out),
            mask: Vec::new(),
            starts: vec![0],
            tokens: 0,
        })
    }

    /// Appends a record (`mask` holds 0 or 1 per id).
    pub fn push(&mut self, ids: &[u32], mask: &[u8]) -> io::Result<()> {
        debug_assert_eq!(ids.len(), mask.len());
        let out = self.out.as_mut().expect("not finished");
        let mut buf = Vec::with_capacity(4 * ids.len());
        for id in ids {
            buf.extend_from_slice(&id.to_le_bytes());
        }
        out.write_all(&buf)?;
        for &m in mask {
            let j = self.tokens;
            if j % 8 == 0 {
                self.mask.push(0);
            }
            if m != 0 {
                *self.mask.last_mut().expect("pushed") |= 1 << (j % 8);
            }
            self.tokens += 1;
        }
        self.starts.push(self.tokens);
        Ok(())
    }

    /// Writes the mask, the record starts and the header, syncs the file and renames it
    /// into place.
    pub fn finish(mut self, layout: Layout, vocab_size: u64) -> io::Result<Header> {
        let header = Header {
            layout,
            vocab_size,
            records: self.starts.len() as u64 - 1,
            tokens: self.tokens,
        };
        let mut out = self.out.take().expect("not finished");
        out.write_all(&self.mask)?;
        let pad = header.starts_offset() - header.mask_offset() - self.mask.len() as u64;
        out.write_all(&vec![0; pad as usize])?;
        for s in &self.starts {
            out.write_all(&s.to_le_bytes())?;
        }
        let mut f = out.into_inner().map_err(|e| e.into_error())?;
        f.seek(SeekFrom::Start(0))?;
        f.write_all(&header.to_bytes())?;
        f.sync_all()?;
        drop(f);
        durable::publish(&self.tmp, &self.path)?;
        Ok(header)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// An open, checked token file.
pub struct TokenFile {
    map: Mmap,
    header: Header,
}

fn u64_at(b: &[u8], at: u64) -> u64 {
    let at = at as usize;
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: u64) -> u32 {
    let at = at as usize;
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl TokenFile {
    pub fn open(path: &Path) -> Result<Self, DataError> {
        let bad = |message: String| DataError::Invalid {
            path: path.into(),
            message: format!("bad token file: {message}"),
        };
        let file = File::open(path).map_err(|source| DataError::Read {
            path: path.into(),
            source,
        })?;
        // SAFETY: token files are written once under a temporary name and renamed into
        // place, never modified; the map is read-only.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| DataError::Read {
            path: path.into(),
            source,
        })?;
        let b = &map[..];
        if b.len() < HEADER as usize || &b[..8] != MAGIC {
            return Err(bad("no token file header".into()));
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(bad(format!(
                "version {version}, this dflash reads version {VERSION} (prepare it again)"
            )));
        }
        let bos = u64_at(b, 24) as i64;
        let layout = match u32_at(b, 12) {
            0 => Layout::Documents,
            1 => Layout::Stream {
                bos: u32::try_from(bos).ok(),
            },
            l => return Err(bad(format!("unknown layout {l}"))),
        };
        let header = Header {
            layout,
            vocab_size: u64_at(b, 16),
            records: u64_at(b, 32),
            tokens: u64_at(b, 40),
        };
        let expect = header.to_bytes();
        if header.tokens > b.len() as u64 || header.records > b.len() as u64 {
            return Err(bad("counts larger than the file".into()));
        }
        if b[..HEADER as usize] != expect[..] || header.file_len() != b.len() as u64 {
            return Err(bad(format!(
                "truncated or corrupt (its header makes it {} bytes, it has {})",
                header.file_len(),
                b.len()
            )));
        }
        let f = Self { map, header };
        f.check(bos).map_err(bad)?;
        Ok(f)
    }

    /// The record starts and the ids against the header.
    fn check(&self, bos: i64) -> Result<(), String> {
        let h = &self.header;
        let mut prev = 0;
        for r in 0..=h.records {
            let s = self.start(r);
            if (r == 0 && s != 0) || s < prev || s > h.tokens {
                return Err(format!("record {r} starts at token {s}"));
            }
            prev = s;
        }
        if prev != h.tokens {
            return Err(format!("the records end at token {prev}, not {}", h.tokens));
        }
        let ids = &self.map[HEADER as usize..h.mask_offset() as usize];
        let max = ids
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .max();
        if max.is_some_and(|m| u64::from(m) >= h.vocab_size) || bos >= h.vocab_size as i64 {
            return Err(format!(
                "a token id is not below vocab_size {}",
                h.vocab_size
            ));
        }
        Ok(())
    }

    pub fn header(&self) -> Header {
        self.header
    }

    fn start(&self, r: u64) -> u64 {
        u64_at(&self.map, self.header.starts_offset() + 8 * r)
    }

    /// Record `r`.
    pub fn record(&self, r: u64) -> Record {
        let (a, b) = (self.start(r), self.start(r + 1));
        let ids = (a..b).map(|j| u32_at(&self.map, HEADER + 4 * j)).collect();
        let mask_at = self.header.mask_offset();
        let mask = (a..b)
            .map(|j| (self.map[(mask_at + j / 8) as usize] >> (j % 8)) & 1)
            .collect();
        Record { ids, mask }
    }

    /// Every record, in order.
    pub fn records(&self) -> impl Iterator<Item = Record> + '_ {
        (0..self.header.records).map(|r| self.record(r))
    }
}
