//! Where the writer's text goes: the trace file, plain or through a gzip encoder whose
//! flush is a deflate sync flush (so a reader of a cut `.gz` gets everything flushed).
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use flate2::write::GzEncoder;

pub(crate) enum Out {
    Plain(BufWriter<File>),
    Gzip(Box<GzEncoder<BufWriter<File>>>),
    Closed,
}

impl Out {
    pub(crate) fn create(path: &Path, gzip: bool) -> io::Result<Out> {
        let f = BufWriter::with_capacity(1 << 20, File::create(path)?);
        Ok(if gzip {
            Out::Gzip(Box::new(GzEncoder::new(f, flate2::Compression::fast())))
        } else {
            Out::Plain(f)
        })
    }

    pub(crate) fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Out::Plain(w) => w.write_all(b),
            Out::Gzip(w) => w.write_all(b),
            Out::Closed => Ok(()),
        }
    }

    /// Makes everything written so far readable from the file: for gzip a sync flush,
    /// which ends the deflate block so a reader of the truncated stream gets it all.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        match self {
            Out::Plain(w) => w.flush(),
            Out::Gzip(w) => w.flush(),
            Out::Closed => Ok(()),
        }
    }

    pub(crate) fn close(&mut self) -> io::Result<()> {
        match std::mem::replace(self, Out::Closed) {
            Out::Plain(mut w) => w.flush(),
            Out::Gzip(w) => w.finish()?.flush(),
            Out::Closed => Ok(()),
        }
    }
}
