//! `dflash train-tokenizer` through the binary: the BPE tiny target's tokenizer (fixtures/tiny-target-bpe) is
//! what the recipe in its README makes, byte for byte, and fits its `config.json`; bad
//! input exits 2 with one line and writes nothing.
mod common;
use common::{dflash, stderr};

use dflash::train::pipeline;

/// The arguments of the README's `dflash train-tokenizer` line, `--out` pointed at `out`.
fn recipe_args(readme: &str, out: &str) -> Vec<String> {
    let line = readme
        .lines()
        .find(|l| l.contains("dflash train-tokenizer "))
        .expect("the tiny target's README gives the train-tokenizer command");
    let mut args: Vec<String> = line
        .split_whitespace()
        .skip_while(|w| *w != "dflash")
        .skip(1)
        .map(String::from)
        .collect();
    let at = args.iter().position(|a| a == "--out").expect("--out") + 1;
    args[at] = out.to_string();
    args
}

#[test]
fn the_bpe_targets_tokenizer_is_what_its_recipe_makes() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("tok");
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-target-bpe");
    let readme = std::fs::read_to_string(target.join("README.md")).unwrap();
    let args = recipe_args(&readme, out.to_str().unwrap());
    assert!(
        args.contains(&"fixtures/corpus/train.txt".to_string()),
        "{args:?}"
    );
    let o = dflash()
        .args(&args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        let made = std::fs::read(out.join(f)).unwrap();
        let shipped = std::fs::read(target.join(f)).unwrap();
        assert!(made == shipped, "{f} differs from the recipe's output");
    }
    // its ids are exactly the target's vocabulary, its specials the trainer's
    let tok = tokenizers::Tokenizer::from_file(target.join("tokenizer.json")).unwrap();
    let cfg = dflash::model::read_target_config(&target).unwrap();
    assert_eq!(tok.get_vocab_size(true) as i64, cfg.vocab_size);
    let names = ["<|bos|>", "<|eos|>", "<|mask|>", "<|pad|>"];
    for (id, name) in names.iter().enumerate() {
        assert_eq!(tok.token_to_id(name), Some(id as u32), "{name}");
    }
    // a real BPE: the corpus takes far fewer tokens than bytes, and decodes back
    let text = std::fs::read_to_string(pipeline::default_corpus()).unwrap();
    let text = &text[..20_000];
    let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
    assert!(ids.len() * 2 < text.len(), "{} tokens", ids.len());
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
}

#[test]
fn bad_input_is_one_line_exit_2_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let p = |name: &str| d.path().join(name).to_str().unwrap().to_string();
    let (empty, small) = (p("empty.txt"), p("small.txt"));
    std::fs::write(&empty, "").unwrap();
    std::fs::write(&small, "def f(x):\n    return x\n".repeat(50)).unwrap();
    let out = p("out");
    let cases: [(&str, &str, &str, String); 4] = [
        (
            "/nonexistent/corpus.txt",
            "400",
            "0.05",
            "/nonexistent/corpus.txt: cannot read the corpus".into(),
        ),
        (
            &empty,
            "400",
            "0.05",
            format!("{empty}: the corpus has no text"),
        ),
        (
            &small,
            "260",
            "0.05",
            "--vocab-size 260 is too small".into(),
        ),
        (&small, "400", "1", "--heldout-fraction 1 is outside".into()),
    ];
    for (corpus, vocab, heldout, needle) in cases {
        let args = [
            "train-tokenizer",
            "--corpus",
            corpus,
            "--vocab-size",
            vocab,
            "--heldout-fraction",
            heldout,
            "--out",
            &out,
        ];
        let o = dflash().args(args).output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(&needle),
            "{args:?}: expected {needle:?} in {err}"
        );
        assert!(!d.path().join("out").exists(), "{args:?} wrote {out}");
    }
    // the same corpus twice: the same files; other files in the directory are kept
    let (a, b) = (p("a"), p("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::write(d.path().join("a/README.md"), "kept").unwrap();
    for dir in [&a, &b] {
        let o = dflash()
            .args(["train-tokenizer", "--corpus", &small, "--vocab-size", "270"])
            .args(["--out", dir.as_str()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("270 ids (10 merges)"), "{}", stderr(&o));
    }
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        let read = |dir: &str| std::fs::read(std::path::Path::new(dir).join(f)).unwrap();
        assert!(read(&a) == read(&b), "{f}");
    }
    assert!(d.path().join("a/README.md").is_file());
    assert!(common::leftovers(d.path()).is_empty());
    let help = dflash()
        .args(["train-tokenizer", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("dflash train-tokenizer --corpus"), "{help}");
}

/// A drafter trains against the BPE target with its own tokenizer: the loss falls, and the
/// noise token is the `<|mask|>` its tokenizer_config.json names (read here with the
/// `tokenizers` crate, not through the trainer's code).
#[test]
fn a_drafter_trains_against_the_bpe_target_with_its_mask_token() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = root.join("fixtures/tiny-target-bpe");
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run");
    let o = dflash()
        .args(["train", "--target", target.to_str().unwrap(), "--run-dir"])
        .arg(&run)
        .args(["--steps", "20"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(target.join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    let tok = tokenizers::Tokenizer::from_file(target.join("tokenizer.json")).unwrap();
    let mask = tok
        .token_to_id(cfg["mask_token"].as_str().unwrap())
        .unwrap();
    let drafter: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("drafter/config.json")).unwrap())
            .unwrap();
    assert_eq!(drafter["mask_token_id"].as_i64(), Some(i64::from(mask)));
    let losses: Vec<f64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["loss"].as_f64())
        .collect();
    assert!(losses.len() >= 10, "{losses:?}");
    let n = losses.len();
    let first: f64 = losses[..3].iter().sum::<f64>() / 3.0;
    let last: f64 = losses[n - 3..].iter().sum::<f64>() / 3.0;
    assert!(last < first, "{losses:?}");
}
