//! An uncompressed file is scanned in parts on every thread of the load's pool: the
//! parts start at guessed event boundaries near equal fractions of the file, each part
//! stops at the start of the next one it meets, and their findings are joined in file
//! order. A gzip stream is scanned in one part.

use std::fs::File;
use std::io::{self, IsTerminal, Read};
use std::path::Path;

use rayon::prelude::*;

use super::input::{LoadError, LoadOptions};
use super::parser::{EventsEnd, Parser, Part};
use super::raw::Raw;
use super::skips::Skipped;
use crate::warning::Warning;

/// What scanning the whole file found.
pub(super) struct Scanned {
    pub raw: Raw,
    pub events: u64,
    pub top: serde_json::Map<String, serde_json::Value>,
    pub warnings: Vec<Warning>,
    pub skips: Vec<Skipped>,
    pub file_bytes: u64,
    pub json_bytes: u64,
}

/// Scans the trace file at `path` (on the current rayon pool).
pub(super) fn scan(path: &Path, opts: &LoadOptions) -> Result<Scanned, LoadError> {
    let io_err = |source| LoadError::Io {
        path: path.into(),
        source,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let file_bytes = file.metadata().map_err(io_err)?.len();
    let mut magic = [0u8; 2];
    let n = read_full(&mut file, &mut magic).map_err(io_err)?;
    if n == 0 {
        return Err(LoadError::Empty { path: path.into() });
    }
    let bar = progress_bar(opts, file_bytes);
    let gz = n == 2 && magic == [0x1f, 0x8b];
    let starts = if gz {
        Vec::new()
    } else {
        part_starts(&file, file_bytes, opts).map_err(io_err)?
    };
    let counted = Counted {
        inner: io::Cursor::new(magic[..n].to_vec()).chain(file),
        bar: bar.clone(),
    };
    let src: Box<dyn Read + Send> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(
            io::BufReader::with_capacity(1 << 20, counted),
        ))
    } else {
        Box::new(counted)
    };
    let mut first = Parser::new(path.into(), gz, src, 0);
    first.stops = starts
        .iter()
        .enumerate()
        .map(|(k, &at)| (at, k + 1))
        .collect();
    first.set_stop();
    let (first, others) = rayon::join(
        || first.parse_document().map(|()| first.into_part()),
        || {
            (0..starts.len())
                .into_par_iter()
                .map(|k| parse_part(path, &bar, &starts, k))
                .collect::<Vec<_>>()
        },
    );
    // parts[k] is the part that starts at starts[k - 1]; parts[0] stays empty.
    let mut parts: Vec<Option<Result<Part, LoadError>>> = vec![None];
    parts.extend(others.into_iter().map(Some));
    let acc = join_parts(first?, &mut parts)?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    Ok(Scanned {
        raw: acc.raw,
        events: acc.index,
        top: acc.top,
        warnings: acc.warnings,
        skips: acc.skips.into_list(),
        file_bytes,
        json_bytes: acc.json_bytes,
    })
}

/// Follows the chain of parts from the first, each starting where the one before it
/// stopped (a part whose start was a wrong guess is never reached), and joins them.
fn join_parts(
    mut acc: Part,
    parts: &mut [Option<Result<Part, LoadError>>],
) -> Result<Part, LoadError> {
    let mut raws = vec![std::mem::take(&mut acc.raw)];
    while let Some(next) = acc
        .stopped
        .and_then(|k| parts.get_mut(k).and_then(Option::take))
    {
        let mut next = next.map_err(|e| e.after_events(acc.index))?;
        raws.push(std::mem::take(&mut next.raw));
        for w in &mut next.warnings {
            if let Warning::Truncated { events_kept, .. } = w {
                *events_kept += acc.index;
            }
        }
        acc.warnings.append(&mut next.warnings);
        acc.skips.absorb(std::mem::take(&mut next.skips), acc.index);
        acc.index += next.index;
        acc.top.extend(next.top);
        acc.json_bytes = next.json_bytes;
        acc.stopped = next.stopped;
    }
    acc.raw = Raw::concat(raws);
    Ok(acc)
}

/// Where the parts after the first one start: at `{` of an event, near equal fractions of
/// the file. A start is a guess (a string or a nested value can hold `},{`): the part
/// before it checks it by stopping there exactly, at the start of an event of
/// `traceEvents`; otherwise that part scans on and the guessed part is dropped.
fn part_starts(file: &File, len: u64, opts: &LoadOptions) -> io::Result<Vec<u64>> {
    let min = if opts.min_part_bytes == 0 {
        16 << 20
    } else {
        opts.min_part_bytes
    };
    // As many parts as the pool running the load has threads.
    let threads = rayon::current_num_threads();
    let parts = (threads as u64).min(len / min.max(1)).max(1);
    let mut starts: Vec<u64> = Vec::new();
    let mut window = vec![0u8; (1 << 20).min(len as usize)];
    for k in 1..parts {
        let from = (len / parts * k).max(starts.last().map_or(0, |&s| s + 1));
        let got = read_at(file, &mut window, from)?;
        if let Some(at) = event_boundary(&window[..got]) {
            starts.push(from + at as u64);
        }
    }
    Ok(starts)
}

/// The first `{` in `s` that follows `}` and `,` (blanks allowed between them).
pub(super) fn event_boundary(s: &[u8]) -> Option<usize> {
    let blank = |b: u8| matches!(b, b' ' | b'\n' | b'\r' | b'\t');
    for comma in memchr::memchr_iter(b',', s) {
        let before = s[..comma].iter().rposition(|&b| !blank(b));
        let after = s[comma + 1..].iter().position(|&b| !blank(b));
        if let (Some(b), Some(a)) = (before, after) {
            if s[b] == b'}' && s[comma + 1 + a] == b'{' {
                return Some(comma + 1 + a);
            }
        }
    }
    None
}

#[cfg(unix)]
pub(super) fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(not(unix))]
pub(super) fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    use std::io::{Seek, SeekFrom};
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(at))?;
    read_full(&mut f, buf)
}

/// Scans the part that starts at `starts[k]` (part `k + 1`) up to the start of a later
/// part, or to the end.
fn parse_part(
    path: &Path,
    bar: &Option<indicatif::ProgressBar>,
    starts: &[u64],
    k: usize,
) -> Result<Part, LoadError> {
    use std::io::{Seek, SeekFrom};
    let io_err = |source| LoadError::Io {
        path: path.into(),
        source,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let from = starts[k];
    file.seek(SeekFrom::Start(from)).map_err(io_err)?;
    let src = Box::new(Counted {
        inner: file,
        bar: bar.clone(),
    });
    let mut p = Parser::new(path.into(), false, src, from);
    p.stops = starts
        .iter()
        .enumerate()
        .skip(k + 1)
        .map(|(j, &at)| (at, j + 1))
        .collect();
    p.set_stop();
    // What kind of document this is was settled by the first part; a part only needs to
    // know whether the array sits in an object.
    let bare = {
        let mut head = [0u8; 64];
        let got = File::open(path)
            .and_then(|f| read_at(&f, &mut head, 0))
            .map_err(io_err)?;
        head[..got]
            .iter()
            .find(|b| !matches!(b, b' ' | b'\n' | b'\r' | b'\t' | 0xEF | 0xBB | 0xBF))
            == Some(&b'[')
    };
    if let EventsEnd::Closed = p.events()? {
        if !bare {
            p.object(true)?;
        }
    }
    Ok(p.into_part())
}

pub(super) fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn progress_bar(opts: &LoadOptions, total: u64) -> Option<indicatif::ProgressBar> {
    // Small files load faster than a bar can draw.
    if !opts.progress || !io::stderr().is_terminal() || total < (64 << 20) {
        return None;
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "loading {bar:40} {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(bar)
}

/// Counts bytes read off the disk into the progress bar.
pub(super) struct Counted<R> {
    pub inner: R,
    pub bar: Option<indicatif::ProgressBar>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(b) = &self.bar {
            b.inc(n as u64);
        }
        Ok(n)
    }
}
