//! Durable, atomic file-system writes: a file or a directory is built under a temporary
//! sibling name, synced to disk (every file, then the directory), and moved into place
//! with one `rename` (files) or one `renameat2(RENAME_EXCHANGE)` (directories), after
//! which the parent directory is synced. A crash at any point leaves the old version or
//! the new one under the final name, never neither and never half of one; what is left
//! over is a temporary sibling that [`clean_leftovers`] removes at the next start.
//!
//! Where the file system cannot exchange two directories, a directory is replaced by
//! moving the old one aside (`.NAME.old-PID`) and the new one in; a crash between the two
//! renames is repaired by [`clean_leftovers`], which moves the old one back.
//!
//! Fault injection: with `DFLASH_CRASH_AT=N` the process kills itself (SIGKILL) at the
//! N-th [`crash_point`] it passes; tests use it to check every step of a checkpoint write.
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Marks of temporary siblings, in `.NAME<MARK>PID`.
const TMP: &str = ".tmp-";
const OLD: &str = ".old-";
const DEL: &str = ".del-";

/// Whether an I/O error means the disk (or the user's quota) is full.
pub fn is_disk_full(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
        || matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Whether any error in `e`'s source chain is a full disk.
pub fn chain_is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<io::Error>().is_some_and(is_disk_full) {
            return true;
        }
        cur = err.source();
    }
    false
}

fn parent_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

fn sibling(path: &Path, mark: &str) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "out".into(), OsStr::to_string_lossy);
    parent_of(path).join(format!(".{name}{mark}{}", std::process::id()))
}

/// Syncs a directory's entry list to disk.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Syncs every file under `dir` (recursively), then every directory, bottom up.
pub fn sync_tree(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            sync_tree(&path)?;
        } else {
            crash_point("file written");
            File::open(&path)?.sync_all()?;
        }
    }
    sync_dir(dir)
}

/// Writes `bytes` to `path` atomically and durably: a temporary sibling, fsync, rename,
/// fsync of the directory.
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = sibling(path, TMP);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        crash_point("temporary file written");
        f.sync_all()?;
        drop(f);
        crash_point("temporary file synced");
        fs::rename(&tmp, path)?;
        crash_point("file renamed");
        sync_dir(parent_of(path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The temporary sibling a streaming writer of `path` writes into before
/// [`publish`] (removed by [`clean_leftovers`] if the writer dies).
pub fn temp_sibling(path: &Path) -> PathBuf {
    sibling(path, TMP)
}

/// Puts a finished, synced temporary file in place: rename, then fsync of the
/// directory.
pub fn publish(tmp: &Path, path: &Path) -> io::Result<()> {
    let result = fs::rename(tmp, path).and_then(|()| sync_dir(parent_of(path)));
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result
}

/// Builds directory `dir` with `fill` (which writes into the temporary directory it is
/// given), syncs it and moves it into place, replacing an existing `dir` atomically.
/// On an error the temporary directory is removed and an existing `dir` is untouched;
/// `io_err` gives an I/O error of this function its path context.
pub fn write_dir<E>(
    dir: &Path,
    fill: impl FnOnce(&Path) -> Result<(), E>,
    io_err: impl Fn(&Path, io::Error) -> E,
) -> Result<(), E> {
    let parent = parent_of(dir);
    fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
    let tmp = sibling(dir, TMP);
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    }
    fs::create_dir(&tmp).map_err(|e| io_err(&tmp, e))?;
    let result = fill(&tmp).and_then(|()| {
        crash_point("directory filled");
        sync_tree(&tmp).map_err(|e| io_err(&tmp, e))?;
        crash_point("directory synced");
        replace_dir(&tmp, dir).map_err(|e| io_err(dir, e))
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

/// Moves the complete, synced directory `tmp` to `dir`, replacing an existing one.
fn replace_dir(tmp: &Path, dir: &Path) -> io::Result<()> {
    let parent = parent_of(dir);
    if !dir.exists() {
        fs::rename(tmp, dir)?;
        crash_point("directory renamed");
        return sync_dir(parent);
    }
    if exchange(tmp, dir)? {
        // `tmp` now holds the old version
        crash_point("directories exchanged");
        sync_dir(parent)?;
        crash_point("parent synced");
        return fs::remove_dir_all(tmp);
    }
    let old = sibling(dir, OLD);
    fs::rename(dir, &old)?;
    crash_point("old directory moved aside");
    fs::rename(tmp, dir)?;
    crash_point("new directory renamed");
    sync_dir(parent)?;
    fs::remove_dir_all(&old)
}

/// Swaps two paths atomically; `Ok(false)` where the file system cannot.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let ca = std::ffi::CString::new(a.as_os_str().as_bytes())?;
    let cb = std::ffi::CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: two valid NUL-terminated paths; renameat2 only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP) => Ok(false),
        _ => Err(e),
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_a: &Path, _b: &Path) -> io::Result<bool> {
    Ok(false)
}

/// Removes directory `dir` so that a crash never leaves half of it under its name: it is
/// renamed away first, then deleted.
pub fn remove_dir(dir: &Path) -> io::Result<()> {
    let del = sibling(dir, DEL);
    fs::rename(dir, &del)?;
    crash_point("directory renamed for removal");
    fs::remove_dir_all(&del)
}

/// What [`clean_leftovers`] did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Cleaned {
    /// Temporary files and directories removed.
    pub removed: Vec<PathBuf>,
    /// Directories moved back under their name after a crash mid-replacement.
    pub restored: Vec<PathBuf>,
}

/// The final name behind a temporary sibling `.NAME<MARK>PID`, and its mark.
fn leftover(name: &str) -> Option<(&str, &'static str)> {
    let rest = name.strip_prefix('.')?;
    for mark in [TMP, OLD, DEL] {
        if let Some(i) = rest.rfind(mark) {
            let pid = &rest[i + mark.len()..];
            if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) {
                return Some((&rest[..i], mark));
            }
        }
    }
    None
}

/// Removes the temporary siblings a crashed writer left in `dir` (not recursive), and
/// moves back a directory that was moved aside for a replacement that never finished.
/// Only call it while no other process writes into `dir` (under the run lock).
pub fn clean_leftovers(dir: &Path) -> io::Result<Cleaned> {
    let mut out = Cleaned::default();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some((target, mark)) =
            leftover(&name.to_string_lossy()).map(|(t, m)| (t.to_string(), m))
        else {
            continue;
        };
        let path = entry.path();
        let final_path = dir.join(&target);
        if mark == OLD && !final_path.exists() {
            fs::rename(&path, &final_path)?;
            out.restored.push(final_path);
            continue;
        }
        if entry.file_type()?.is_dir() {
            fs::remove_dir_all(&path)?;
        } else {
            fs::remove_file(&path)?;
        }
        out.removed.push(path);
    }
    if !out.removed.is_empty() || !out.restored.is_empty() {
        sync_dir(dir)?;
    }
    Ok(out)
}

/// Whether `name` is a temporary sibling left by a writer of this module.
pub fn is_leftover(name: &str) -> bool {
    leftover(name).is_some()
}

static CRASH_AT: OnceLock<Option<u64>> = OnceLock::new();
static PASSED: AtomicU64 = AtomicU64::new(0);
/// In-process fault injection (tests): the point that panics, 0 for none.
static PANIC_AT: AtomicU64 = AtomicU64::new(0);

/// A point where a crash must leave things consistent. With `DFLASH_CRASH_AT=N` set, the
/// N-th point passed kills the process (SIGKILL: no destructor, no buffered write runs).
pub fn crash_point(what: &str) {
    let panic_at = PANIC_AT.load(Ordering::Relaxed);
    if panic_at != 0 {
        if PASSED.fetch_add(1, Ordering::Relaxed) + 1 == panic_at {
            PANIC_AT.store(0, Ordering::Relaxed);
            panic!("injected crash at \"{what}\"");
        }
        return;
    }
    let at = *CRASH_AT.get_or_init(|| {
        std::env::var("DFLASH_CRASH_AT")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    let Some(at) = at else {
        return;
    };
    let n = PASSED.fetch_add(1, Ordering::Relaxed) + 1;
    if n == at {
        eprintln!("DFLASH_CRASH_AT={at}: killed at \"{what}\"");
        // SAFETY: raising a signal on our own process.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

/// Tests: makes the `n`-th [`crash_point`] from now panic (a crash without clean-up, as
/// long as no destructor writes), or none with 0. Process-wide.
#[doc(hidden)]
pub fn panic_at_crash_point(n: u64) {
    PASSED.store(0, Ordering::Relaxed);
    PANIC_AT.store(n, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftover_names_are_recognised_and_others_are_not() {
        assert_eq!(
            leftover(".step-00000010.tmp-4242"),
            Some(("step-00000010", TMP))
        );
        assert_eq!(leftover(".drafter.old-7"), Some(("drafter", OLD)));
        assert_eq!(leftover(".latest.tmp-12"), Some(("latest", TMP)));
        assert_eq!(leftover(".a.del-1"), Some(("a", DEL)));
        for name in [
            "step-1",
            ".lock",
            ".x.tmp-",
            ".x.tmp-12a",
            "trace.json",
            ".tmp-1x",
        ] {
            assert_eq!(leftover(name), None, "{name}");
        }
    }

    #[test]
    fn write_dir_replaces_and_cleanup_restores_a_dir_moved_aside() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("drafter");
        let keep = |_: &Path, e: io::Error| e;
        write_dir(&dir, |t| fs::write(t.join("a"), "1"), keep).unwrap();
        write_dir(&dir, |t| fs::write(t.join("a"), "2"), keep).unwrap();
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "2");
        // a failing fill leaves the old version and no temporary directory
        let e = write_dir(
            &dir,
            |t| {
                fs::write(t.join("a"), "3")?;
                Err(io::Error::other("boom"))
            },
            keep,
        );
        assert!(e.is_err());
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "2");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
        // a crash between "moved aside" and "renamed in" of the fallback path
        fs::rename(&dir, d.path().join(".drafter.old-99")).unwrap();
        fs::create_dir(d.path().join(".drafter.tmp-99")).unwrap();
        fs::write(d.path().join(".latest.tmp-99"), "x").unwrap();
        let c = clean_leftovers(d.path()).unwrap();
        assert_eq!(c.restored, vec![dir.clone()]);
        assert_eq!(c.removed.len(), 2);
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "2");
        let names: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsStr::new("drafter").to_owned()]);
    }

    #[test]
    fn write_file_replaces_atomically() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("latest");
        write_file(&p, b"step-1").unwrap();
        write_file(&p, b"step-2").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "step-2");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn disk_full_is_recognised_through_a_source_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] io::Error);
        let full = io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(is_disk_full(&full));
        assert!(chain_is_disk_full(&Outer(full)));
        assert!(!chain_is_disk_full(&Outer(io::Error::from_raw_os_error(
            libc::EACCES
        ))));
    }
}
