//! Crashes through the `dflash` binary. `kill -9` at random points: `--resume` (or, when
//! the kill came before the run wrote its configuration, a fresh start) always works,
//! loses at most the checkpoint interval, and ends with a drafter byte-identical to an
//! uninterrupted run's, with every step logged once. `DFLASH_CRASH_AT=N` (SIGKILL at the
//! N-th write/sync/rename point): `latest` always names a complete checkpoint.
//!
//! The fast versions run a few trials; the long ones are ignored by default:
//! `cargo test -p dflash --test crash -- --ignored --nocapture` (trial count and seed
//! from `DFLASH_TRIALS` and `DFLASH_TRIAL_SEED`).
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

mod common;
use common::{dflash, leftovers, metric_lines, metric_steps, stderr, NO_HELDOUT, SMALL};

const STEPS: &str = "12";

fn cmd(run: &Path, args: &[&str]) -> Command {
    let mut c = dflash();
    c.arg("train")
        .args(args)
        .arg("--run-dir")
        .arg(run)
        .args(SMALL)
        .args(NO_HELDOUT)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// An uninterrupted run: its drafter bytes, losses and wall time.
struct Reference {
    drafter: Vec<u8>,
    losses: Vec<f64>,
    secs: f64,
}

fn reference(dir: &Path, args: &[&str]) -> Reference {
    let run = dir.join("reference");
    let t0 = Instant::now();
    let out = cmd(&run, args).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    Reference {
        drafter: std::fs::read(run.join("drafter/model.safetensors")).unwrap(),
        losses: common::losses(&run),
        secs: t0.elapsed().as_secs_f64(),
    }
}

#[derive(Debug, Default)]
struct Tally {
    trials: usize,
    before_config: usize,
    no_checkpoint: usize,
    from_checkpoint: usize,
    after_finish: usize,
    inside_write: usize,
    max_lost_steps: i64,
}

/// The step a `--resume` continued from, from its progress line.
fn resumed_from(err: &str) -> Option<i64> {
    if err.contains("has no checkpoint yet") {
        return Some(0);
    }
    let tail = err.split("resuming from ").nth(1)?;
    let step = tail.split("(step ").nth(1)?.split(')').next()?;
    step.parse().ok()
}

/// One trial: start, kill -9 after `delay`, then resume (or start fresh) until finished;
/// checks the end state against the reference. `interval` is the checkpoint interval in
/// seconds when the trial sets one, to check what a kill may lose.
fn kill_trial(
    dir: &Path,
    n: usize,
    args: &[&str],
    delay: Duration,
    interval: Option<f64>,
    reference: &Reference,
    tally: &mut Tally,
) {
    let run = dir.join(format!("trial-{n}"));
    let t0 = Instant::now();
    let mut child = cmd(&run, args).spawn().unwrap();
    // (seconds since start, lines logged) while it runs
    let mut seen: Vec<(f64, usize)> = Vec::new();
    while t0.elapsed() < delay {
        seen.push((t0.elapsed().as_secs_f64(), metric_lines(&run)));
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let status = child.wait().unwrap();
    let killed_at = t0.elapsed().as_secs_f64();
    let lines_at_kill = metric_lines(&run);
    tally.trials += 1;
    if !leftovers(&run).is_empty() {
        tally.inside_write += 1;
    }
    let ctx = format!(
        "trial {n} (kill after {:.2} s, {lines_at_kill} steps logged)",
        delay.as_secs_f64()
    );
    if status.success() {
        tally.after_finish += 1;
    } else if !run.join("config.toml").exists() {
        tally.before_config += 1;
        let out = cmd(&run, args).output().unwrap();
        assert!(
            out.status.success(),
            "{ctx}: fresh start after an early kill: {}",
            stderr(&out)
        );
    } else {
        // not quiet: the first line tells where it resumed
        let args_no_quiet: Vec<&str> = SMALL.iter().copied().filter(|a| *a != "--quiet").collect();
        let out = dflash()
            .args(["train", "--resume", "--run-dir"])
            .arg(&run)
            .args(&args_no_quiet)
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(out.status.success(), "{ctx}: --resume failed: {err}");
        if err.contains("is already finished") {
            tally.after_finish += 1;
        } else {
            let from = resumed_from(&err).unwrap_or_else(|| panic!("{ctx}: {err}"));
            if from == 0 {
                tally.no_checkpoint += 1;
            } else {
                tally.from_checkpoint += 1;
            }
            let lost = lines_at_kill as i64 - from;
            assert!(
                lost >= 0,
                "{ctx}: resumed from {from}, past what was logged"
            );
            tally.max_lost_steps = tally.max_lost_steps.max(lost);
            if let Some(i) = interval {
                // a checkpoint is due `i` seconds after the last; with a step and a save, 2 s of slack
                let bound = killed_at - i - 2.0;
                let logged_then = seen
                    .iter()
                    .filter(|(t, _)| *t <= bound)
                    .map(|(_, l)| *l)
                    .max()
                    .unwrap_or(0) as i64;
                assert!(
                from >= logged_then,
                "{ctx}: resumed from step {from}, but {logged_then} steps were logged {i} s before the kill"
            );
            }
        }
    }
    let steps: i64 = STEPS.parse().unwrap();
    assert_eq!(
        metric_steps(&run),
        (0..steps).collect::<Vec<_>>(),
        "{ctx}: each step once"
    );
    let drafter = std::fs::read(run.join("drafter/model.safetensors")).unwrap();
    assert!(
        drafter == reference.drafter,
        "{ctx}: the drafter differs from the uninterrupted run's"
    );
    let losses = common::losses(&run);
    assert_eq!(losses, reference.losses, "{ctx}: losses");
    assert_eq!(leftovers(&run), Vec::<PathBuf>::new(), "{ctx}");
    std::fs::remove_dir_all(&run).unwrap();
}

fn kill_trials(default: usize, every_step: usize, timed: usize) {
    let seed: u64 = std::env::var("DFLASH_TRIAL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(21);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let base = ["--steps", STEPS];
    let r = reference(dir.path(), &base);
    println!("reference run: {:.1} s; trial seed {seed}", r.secs);
    let groups: [(&str, Vec<&str>, Option<f64>, usize); 3] = [
        ("default config", base.to_vec(), None, default),
        (
            "a checkpoint every step",
            [&base[..], &["--set", "checkpoint_every=1"]].concat(),
            None,
            every_step,
        ),
        (
            "a checkpoint every 0.6 s",
            [&base[..], &["--set", "checkpoint_minutes=0.01"]].concat(),
            Some(0.6),
            timed,
        ),
    ];
    let mut n = 0;
    for (name, args, interval, count) in groups {
        let mut tally = Tally::default();
        for _ in 0..count {
            let delay = Duration::from_secs_f64(rng.gen_range(0.0..r.secs * 1.05));
            kill_trial(dir.path(), n, &args, delay, interval, &r, &mut tally);
            n += 1;
        }
        println!("{name}: {tally:?}");
    }
}

#[test]
fn kill_9_at_random_points_then_resume_equals_an_uninterrupted_run() {
    kill_trials(2, 1, 0);
}

#[test]
#[ignore = "long: about 25 s per trial; run with --ignored"]
fn kill_9_at_random_points_many_trials() {
    let n: usize = std::env::var("DFLASH_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    kill_trials(n, n, n / 2);
}

/// Kills at crash points `points` (`None`: every point until a run completes) of a run
/// with two checkpoints and the drafter export, and checks each.
fn crash_points(points: Option<Vec<u64>>) {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--steps",
        "4",
        "--set",
        "checkpoint_every=2",
        "--set",
        "keep_checkpoints=1",
    ];
    let r = reference(dir.path(), &args);
    let list: Box<dyn Iterator<Item = u64>> = match points {
        Some(p) => Box::new(p.into_iter()),
        None => Box::new(1..),
    };
    let (mut crashed, mut named) = (0, [0u32; 3]);
    for n in list {
        let run = dir.path().join(format!("point-{n}"));
        let out = cmd(&run, &args)
            .env("DFLASH_CRASH_AT", n.to_string())
            .output()
            .unwrap();
        if out.status.success() {
            println!("{} crash points; a run passes {} of them", crashed, n - 1);
            break;
        }
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGKILL),
            "point {n}: {}",
            stderr(&out)
        );
        crashed += 1;
        // `latest`, when there is one, names a complete checkpoint
        let latest =
            dflash::train::checkpoint::latest(&run).unwrap_or_else(|e| panic!("point {n}: {e}"));
        let step = latest.as_ref().map_or(0, |c| c.step);
        if let Some(c) = &latest {
            let st = dflash::train::checkpoint::read_state(&c.dir).unwrap();
            assert_eq!(st.step, c.step, "point {n}");
            assert!(
                c.dir.join("drafter/model.safetensors").is_file(),
                "point {n}"
            );
            assert!(c.dir.join("optimizer.safetensors").is_file(), "point {n}");
        }
        named[(step / 2) as usize] += 1;
        let again = if run.join("config.toml").exists() {
            cmd(&run, &["--resume"]).output().unwrap()
        } else {
            cmd(&run, &args).output().unwrap()
        };
        assert!(again.status.success(), "point {n}: {}", stderr(&again));
        let drafter = std::fs::read(run.join("drafter/model.safetensors")).unwrap();
        assert!(drafter == r.drafter, "point {n}: drafter differs");
        assert_eq!(metric_steps(&run), [0, 1, 2, 3], "point {n}");
        assert_eq!(leftovers(&run), Vec::<PathBuf>::new(), "point {n}");
        std::fs::remove_dir_all(&run).unwrap();
    }
    println!("latest named no checkpoint / step 2 / step 4: {named:?}");
    assert!(crashed > 0);
}

#[test]
fn sigkill_at_sampled_write_points_leaves_latest_complete() {
    // one in the configuration's write, one in each checkpoint
    crash_points(Some(vec![2, 16, 32]));
}

#[test]
#[ignore = "long: about 10 s per crash point; run with --ignored"]
fn sigkill_at_every_write_point_leaves_latest_complete() {
    crash_points(None);
}
