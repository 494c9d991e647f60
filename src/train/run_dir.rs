//! The run directory's safety: one trainer at a time (an exclusive `flock` on `.lock`,
//! which the kernel releases when the process dies, so a killed run never blocks its
//! resume), no fresh run in a directory that holds another run's output, leftovers of a
//! crashed writer cleaned at start, `config.toml` and `summary.json` replaced atomically.
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{durable, run_files};

use super::checkpoint;
use super::config::TrainConfig;

/// A run directory that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error("{dir} is in use by another dflash process ({holder}): wait for it to finish or stop it, or choose another directory")]
    InUse { dir: PathBuf, holder: String },
    #[error(
        "{dir} already holds a run: pass --resume to continue it, or choose another directory"
    )]
    HoldsRun { dir: PathBuf },
    #[error("{dir} is not empty (it holds {entry}): choose a new or empty run directory")]
    NotEmpty { dir: PathBuf, entry: String },
    #[error("cannot use run directory {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RunDirError + '_ {
    move |source| RunDirError::Io {
        path: path.into(),
        source,
    }
}

/// A locked run directory; the lock is released when this is dropped (or the process
/// dies).
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    _lock: File,
}

/// Whether a fresh run or a resume opens the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Fresh,
    Resume,
}

/// Files a run writes; any of them makes a directory "hold a run".
const RUN_OUTPUTS: &[&str] = &[
    run_files::CONFIG,
    run_files::METRICS,
    run_files::SUMMARY,
    run_files::CHECKPOINTS,
    run_files::DRAFTER,
    run_files::FIDELITY,
];

impl RunDir {
    /// Creates the directory if needed and takes its lock before anything else is
    /// written. A fresh run refuses a directory that holds anything but the lock file
    /// and temporary leftovers. Leftovers of a crashed writer are then removed.
    pub fn open(path: &Path, mode: Mode) -> Result<RunDir, RunDirError> {
        fs::create_dir_all(path).map_err(io_err(path))?;
        let lock = lock(path)?;
        if mode == Mode::Fresh {
            refuse_outputs(path)?;
        }
        durable::clean_leftovers(path).map_err(io_err(path))?;
        checkpoint::clean_leftovers(path).map_err(io_err(path))?;
        Ok(RunDir {
            path: path.into(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes the effective configuration (atomically).
    pub fn write_config(&self, cfg: &TrainConfig) -> io::Result<()> {
        durable::write_file(&self.file(run_files::CONFIG), cfg.to_toml().as_bytes())
    }
}

/// Takes the exclusive lock of `dir`, or names the process that holds it.
fn lock(dir: &Path) -> Result<File, RunDirError> {
    let path = dir.join(run_files::LOCK);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err(&path))?;
    // SAFETY: flock on a file descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(RunDirError::Io { path, source: e });
        }
        return Err(RunDirError::InUse {
            dir: dir.into(),
            holder: holder(&mut file),
        });
    }
    file.set_len(0).map_err(io_err(&path))?;
    file.rewind().map_err(io_err(&path))?;
    writeln!(file, "{}", std::process::id()).map_err(io_err(&path))?;
    Ok(file)
}

/// The pid the lock holder wrote (it writes it right after locking: wait a moment).
fn holder(file: &mut File) -> String {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let mut text = String::new();
        let _ = file.rewind();
        let _ = file.read_to_string(&mut text);
        if let Ok(pid) = text.trim().parse::<u32>() {
            return format!("pid {pid}");
        }
        if Instant::now() >= deadline {
            return "pid unknown".into();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn refuse_outputs(dir: &Path) -> Result<(), RunDirError> {
    let mut entries: Vec<String> = fs::read_dir(dir)
        .map_err(io_err(dir))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .map_err(io_err(dir))?;
    entries.retain(|n| n != run_files::LOCK && !durable::is_leftover(n));
    entries.sort();
    if entries
        .iter()
        .any(|n| RUN_OUTPUTS.contains(&n.as_str()) || run_files::trace_segment(n).is_some())
    {
        return Err(RunDirError::HoldsRun { dir: dir.into() });
    }
    match entries.into_iter().next() {
        Some(entry) => Err(RunDirError::NotEmpty {
            dir: dir.into(),
            entry,
        }),
        None => Ok(()),
    }
}

/// Reads `summary.json` if there is a readable one.
pub fn read_summary(dir: &Path) -> Option<serde_json::Value> {
    let text = fs::read_to_string(dir.join(run_files::SUMMARY)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Writes `summary.json` atomically.
pub fn write_summary(dir: &Path, summary: &impl serde::Serialize) -> io::Result<()> {
    let text = serde_json::to_string_pretty(summary).map_err(io::Error::other)?;
    durable::write_file(&dir.join(run_files::SUMMARY), text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_opener_is_refused_naming_the_holder_and_a_fresh_run_refuses_output() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        let held = RunDir::open(&run, Mode::Fresh).unwrap();
        let e = RunDir::open(&run, Mode::Resume).unwrap_err().to_string();
        let want = format!(
            "is in use by another dflash process (pid {})",
            std::process::id()
        );
        assert!(e.contains(&want), "{e}");
        drop(held);
        // the lock file and leftovers do not make a run; an output does
        fs::write(run.join(".config.toml.tmp-77"), "").unwrap();
        let again = RunDir::open(&run, Mode::Fresh).unwrap();
        assert!(!run.join(".config.toml.tmp-77").exists());
        again.write_config(&TrainConfig::default()).unwrap();
        drop(again);
        let e = RunDir::open(&run, Mode::Fresh).unwrap_err().to_string();
        assert!(e.contains("already holds a run"), "{e}");
        RunDir::open(&run, Mode::Resume).unwrap();
        let other = d.path().join("other");
        fs::create_dir(&other).unwrap();
        fs::write(other.join("notes.txt"), "").unwrap();
        let e = RunDir::open(&other, Mode::Fresh).unwrap_err().to_string();
        assert!(e.contains("is not empty (it holds notes.txt)"), "{e}");
    }
}
