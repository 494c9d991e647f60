//! Tokenizers, chat templates and prepared token files, against truth computed
//! independently: a chat's expected ids and mask come from tokenizing the expected
//! rendering's segments one by one with the `tokenizers` crate; a prepared file must give
//! the data loader's very batches of its source tokenized on the fly (and the same
//! training losses); bad input through the binary exits 2 with one line naming the file
//! and the line.
mod common;
use common::{dflash, losses, stderr, train_ok, SMALL};

use std::path::{Path, PathBuf};

use dflash::train::data::{self, Loader};
use dflash::train::tokenizer::{self, HfTokenizer, Tokenizer};
use dflash::train::{pipeline, records};
use serde_json::{json, Value};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::AddedToken;

const SPECIALS: &[&str] = &[
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
];

/// Qwen2.5's ChatML template: a default system turn when the conversation has none.
const QWEN25: &str = r#"{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

/// Llama 3's template: BOS, role headers, trimmed content, and a generation prompt.
const LLAMA3: &str = r#"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}"#;

/// Qwen3's template (thinking): only assistant turns after the last user query keep a
/// `<think>` block, so the last turn renders differently once another follows.
const QWEN3: &str = r#"{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "user" or message.role == "system" %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in message.content %}
            {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

const CORPUS: &[&str] = &[
    "What is two plus two? Four. And three plus three? Six.",
    "You are terse. You are a helpful assistant. Hello! How can I help?",
    "system user assistant tool. Tell me a joke about the sea.",
    "The quick brown fox jumps over the lazy dog, again and again.",
];

/// A byte-level BPE (like Qwen's and Llama 3's) trained on a few lines, with the chat
/// special tokens, saved with `template` as `DIR/tokenizer.json` and
/// `DIR/tokenizer_config.json`.
fn bpe_dir(dir: &Path, template: &str, bos: Option<&str>) -> PathBuf {
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_post_processor(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    let specials: Vec<AddedToken> = SPECIALS
        .iter()
        .map(|s| AddedToken::from(*s, true))
        .collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(400)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    tok.train(&mut trainer, CORPUS.iter()).unwrap();
    save(dir, &tok, template, bos)
}

/// A word-level tokenizer of under 260 ids (it fits the embedded tiny target), with `fill`
/// more words (`w0`, `w1`, ...) after its own.
fn word_dir(dir: &Path, template: &str, fill: i64) -> PathBuf {
    let mut vocab = serde_json::Map::new();
    let words = CORPUS.join(" ");
    let fill = (0..fill).map(|i| format!("w{i}"));
    let words = ["[UNK]"]
        .into_iter()
        .chain(words.split(|c: char| !c.is_alphanumeric()))
        .chain(["?", "!", ".", ",", "<", ">", "|"])
        .map(String::from)
        .chain(fill);
    for w in words.filter(|w| !w.is_empty()) {
        let n = vocab.len();
        vocab.entry(w.to_string()).or_insert(json!(n));
    }
    let model = json!({"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"});
    let model: WordLevel = serde_json::from_str(&model.to_string()).unwrap();
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(Whitespace {}));
    save(dir, &tok, template, None)
}

fn save(dir: &Path, tok: &tokenizers::Tokenizer, template: &str, bos: Option<&str>) -> PathBuf {
    let mut tok = tok.clone();
    let specials: Vec<AddedToken> = SPECIALS
        .iter()
        .map(|s| AddedToken::from(*s, true))
        .collect();
    tok.add_special_tokens(&specials);
    std::fs::create_dir_all(dir).unwrap();
    tok.save(dir.join("tokenizer.json"), false).unwrap();
    let cfg = json!({
        "chat_template": template,
        "bos_token": bos,
        "eos_token": "<|im_end|>",
        "add_bos_token": bos.is_some(),
    });
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir.to_path_buf()
}

fn load(dir: &Path) -> Tokenizer {
    Tokenizer::Hf(Box::new(HfTokenizer::load(dir).unwrap()))
}

/// The expected ids and mask: each segment tokenized on its own by the `tokenizers`
/// crate (no template, no offsets involved), the mask 1 on assistant segments.
fn expected(dir: &Path, segments: &[(&str, bool)]) -> (Vec<u32>, Vec<u8>) {
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for (text, assistant) in segments {
        let e = tok.encode(*text, false).unwrap();
        ids.extend_from_slice(e.get_ids());
        mask.extend(std::iter::repeat_n(*assistant as u8, e.get_ids().len()));
    }
    (ids, mask)
}

fn check(dir: &Path, messages: &[Value], segments: &[(&str, bool)]) {
    let tok = load(dir);
    let rendered = tok.chat().unwrap().render_spans(messages).unwrap().text;
    assert_eq!(rendered, segments.iter().map(|s| s.0).collect::<String>());
    let got = records::conversation(messages, &tok).unwrap().unwrap();
    let (ids, mask) = expected(dir, segments);
    assert!(ids.len() > 20 && mask.contains(&0) && mask.contains(&1));
    assert_eq!((got.ids, got.mask), (ids, mask));
}

fn msg(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

#[test]
fn a_chat_with_a_system_turn_renders_to_the_expected_ids_and_mask() {
    let d = tempfile::tempdir().unwrap();
    let dir = bpe_dir(d.path(), QWEN25, None);
    let conv = [
        msg("system", "You are terse."),
        msg("user", "What is two plus two?"),
        msg("assistant", "Four."),
        msg("user", "And three plus three?"),
        msg("assistant", "Six."),
    ];
    check(
        &dir,
        &conv,
        &[
            ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n", false),
            ("Four.<|im_end|>\n", true),
            ("<|im_start|>user\nAnd three plus three?<|im_end|>\n<|im_start|>assistant\n", false),
            ("Six.<|im_end|>\n", true),
        ],
    );
    // without one, the template's default system turn is there and unweighted
    check(
        &dir,
        &conv[1..3],
        &[
            ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n", false),
            ("Four.<|im_end|>\n", true),
        ],
    );
}

#[test]
fn a_chat_with_a_generation_prompt_is_weighted_after_the_prompt() {
    let d = tempfile::tempdir().unwrap();
    let dir = bpe_dir(d.path(), LLAMA3, Some("<|begin_of_text|>"));
    let conv = [
        msg("user", "Hello!"),
        msg("assistant", "  Hello! How can I help?\n"),
        msg("user", "Tell me a joke about the sea."),
        msg("assistant", "The sea? Again and again."),
    ];
    let prompt = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    // the generation prompt is what the template adds after the user's turn
    let tok = load(&dir);
    let first = minijinja_messages(&conv[..1]);
    assert_eq!(tok.chat().unwrap().render(&first, true).unwrap(), prompt);
    check(
        &dir,
        &conv,
        &[
            (prompt, false),
            ("Hello! How can I help?<|eot_id|>", true),
            ("<|start_header_id|>user<|end_header_id|>\n\nTell me a joke about the sea.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", false),
            ("The sea? Again and again.<|eot_id|>", true),
        ],
    );
}

fn minijinja_messages(m: &[Value]) -> Vec<minijinja::Value> {
    m.iter()
        .map(|v| minijinja::Value::from(minijinja::value::Serde(v)))
        .collect()
}

#[test]
fn qwen3_thinking_template_weights_each_turn_as_rendered_in_the_whole_chat() {
    let d = tempfile::tempdir().unwrap();
    let dir = bpe_dir(d.path(), QWEN3, None);
    let conv = [
        msg("user", "What is two plus two?"),
        msg("assistant", "<think>\nAdd them.\n</think>\n\nFour."),
        msg("user", "And three plus three?"),
        msg("assistant", "Six."),
    ];
    check(
        &dir,
        &conv,
        &[
            (
                "<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n",
                false,
            ),
            // an earlier turn loses its reasoning; the last one gets an empty think block
            ("Four.<|im_end|>\n", true),
            (
                "<|im_start|>user\nAnd three plus three?<|im_end|>\n<|im_start|>assistant\n",
                false,
            ),
            ("<think>\n\n</think>\n\nSix.<|im_end|>\n", true),
        ],
    );
}

fn write(dir: &Path, name: &str, lines: &[Value]) -> PathBuf {
    let p = dir.join(name);
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&p, text.join("\n") + "\n").unwrap();
    p
}

fn chats(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let q = ["What is two plus two?", "Tell me a joke about the sea."][i % 2];
            let mut m = vec![
                msg("user", q),
                msg("assistant", &CORPUS[i % 4].repeat(1 + i % 3)),
            ];
            if i % 3 == 0 {
                m.insert(0, msg("system", "You are terse."));
                m.push(msg("user", "And three plus three?"));
                m.push(msg("assistant", "Six."));
            }
            json!({"messages": m, "id": i})
        })
        .collect()
}

#[test]
fn sharegpt_and_openai_chats_are_the_same_records() {
    let d = tempfile::tempdir().unwrap();
    let dir = bpe_dir(&d.path().join("tok"), QWEN25, None);
    let openai = chats(6);
    let share: Vec<Value> = openai
        .iter()
        .map(|r| {
            let turns: Vec<Value> = r["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    let from = match m["role"].as_str().unwrap() {
                        "user" => "human",
                        "assistant" => "gpt",
                        other => other,
                    };
                    json!({"from": from, "value": m["content"]})
                })
                .collect();
            json!({"conversations": turns})
        })
        .collect();
    let tok = load(&dir);
    let a = data::load_with(&write(d.path(), "a.jsonl", &openai), &tok, 64, 1000, 0.0).unwrap();
    let b = data::load_with(&write(d.path(), "b.jsonl", &share), &tok, 64, 1000, 0.0).unwrap();
    assert_eq!(a.train.len(), 6);
    assert_eq!(a.train, b.train);
}

/// A target directory with only what `prepare-data` reads: `config.json`.
fn fake_target(dir: &Path, vocab: i64) -> PathBuf {
    let t = dir.join("target");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(
        t.join("config.json"),
        json!({"vocab_size": vocab}).to_string(),
    )
    .unwrap();
    t
}

fn prepare(args: &[&Path]) -> std::process::Output {
    let names = ["--target", "--data", "--out", "--tokenizer"];
    let mut cmd = dflash();
    cmd.arg("prepare-data");
    for (n, a) in names.iter().zip(args) {
        cmd.arg(n).arg(a);
    }
    cmd.output().unwrap()
}

fn batches(ds: data::Dataset) -> Vec<(Vec<i64>, Vec<i64>, Vec<i64>)> {
    let mut l = Loader::new(ds.train, 256, 5, 0, 0);
    (0..2 * l.batches_per_epoch())
        .map(|_| {
            let b = l.next_batch();
            let v = |t: &tch::Tensor| Vec::<i64>::try_from(t.view([-1])).unwrap();
            (b.input_ids.size(), v(&b.input_ids), v(&b.loss_mask))
        })
        .collect()
}

#[test]
fn prepare_data_then_loading_gives_the_batches_of_tokenizing_on_the_fly() {
    let d = tempfile::tempdir().unwrap();
    let target = fake_target(d.path(), 1000);
    let tok_dir = bpe_dir(&target, QWEN25, Some("<|endoftext|>"));
    let text = CORPUS.join("\n").repeat(40);
    std::fs::write(d.path().join("plain.txt"), &text).unwrap();
    let docs: Vec<Value> = CORPUS
        .iter()
        .cycle()
        .take(30)
        .map(|t| json!({"text": t}))
        .collect();
    let ids: Vec<Value> = (0..30)
        .map(|i| json!({"input_ids": (0..(5 + i % 17)).map(|j| (i * 31 + j) % 997).collect::<Vec<_>>(), "loss_mask": (0..(5 + i % 17)).map(|j| (j % 3 != 0) as i64).collect::<Vec<_>>()}))
        .collect();
    let sources = [
        d.path().join("plain.txt"),
        write(d.path(), "docs.jsonl", &docs),
        write(d.path(), "chats.jsonl", &chats(40)),
        write(d.path(), "ids.jsonl", &ids),
    ];
    // the target's own tokenizer.json is the default
    let tok = tokenizer::resolve(None, Some(&target), 1000).unwrap();
    assert_eq!(
        tok.describe(),
        tok_dir.join("tokenizer.json").display().to_string()
    );
    for src in &sources {
        let out = src.with_extension("tok");
        let o = prepare(&[&target, src, &out]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("prepared"), "{}", stderr(&o));
        let fly = data::load_with(src, &tok, 48, 1000, 0.1).unwrap();
        let prepared = data::load_with(&out, &Tokenizer::Bytes, 48, 1000, 0.1).unwrap();
        assert!(fly.train.len() >= 8, "{src:?}: {}", fly.train.len());
        assert_eq!(fly.heldout, prepared.heldout, "{src:?}");
        let (a, b) = (batches(fly), batches(prepared));
        assert!(a.len() >= 4);
        assert_eq!(a, b, "{src:?}");
        let masks: Vec<i64> = a.iter().flat_map(|x| x.2.clone()).collect();
        assert!(masks.contains(&0) && masks.contains(&1), "{src:?}");
    }
}

#[test]
fn training_on_a_prepared_file_equals_training_on_its_source() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("corpus.tok");
    let corpus = dflash::train::pipeline::default_corpus();
    let o = dflash()
        .args(["prepare-data", "--data"])
        .arg(&corpus)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    train_ok(&a, &["--steps", "4", "--data", corpus.to_str().unwrap()]);
    train_ok(&b, &["--steps", "4", "--data", out.to_str().unwrap()]);
    let (la, lb) = (losses(&a), losses(&b));
    assert_eq!(la.len(), 4);
    for (x, y) in la.iter().zip(&lb) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{la:?} vs {lb:?}");
    }
    // and a chat file through --tokenizer trains on the tiny target
    let tok = word_dir(&d.path().join("words"), QWEN25, 0);
    let data = write(d.path(), "chats.jsonl", &chats(60));
    let c = d.path().join("c");
    train_ok(
        &c,
        &[
            "--steps",
            "2",
            "--tokenizer",
            tok.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
        ],
    );
    let cfg = std::fs::read_to_string(c.join("config.toml")).unwrap();
    assert!(cfg.contains("tokenizer = "), "{cfg}");
}

/// `dflash ARGS` fails with exit 2 and one line containing every needle.
fn refused(args: &[&str], needles: &[&str]) {
    let out = dflash().args(args).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: expected {n:?} in {err}");
    }
}

#[test]
fn bad_input_is_refused_in_one_line_naming_the_file_and_line() {
    let d = tempfile::tempdir().unwrap();
    let p = |s: &Path| s.to_str().unwrap().to_string();
    let run = p(&d.path().join("run"));
    let tcfg = dflash::model::read_target_config(&pipeline::default_target_dir()).unwrap();
    let big = p(&word_dir(&d.path().join("big"), QWEN25, tcfg.vocab_size));
    let raising = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{{ m.content }}{% endfor %}";
    let strict = p(&word_dir(&d.path().join("strict"), raising, 0));
    let words = p(&word_dir(&d.path().join("words"), QWEN25, 0));
    let broken = p(&word_dir(
        &d.path().join("broken"),
        "{% for m in messages %}",
        0,
    ));
    let conv = |sys: bool, asst: bool| {
        let mut m = vec![msg("user", "Hello!")];
        if sys {
            m.insert(0, msg("system", "You are terse."));
        }
        if asst {
            m.push(msg("assistant", "Four."));
        }
        json!({"messages": m})
    };
    let chat = p(&write(
        d.path(),
        "chat.jsonl",
        &[conv(false, true), conv(true, true)],
    ));
    let lonely = p(&write(d.path(), "lonely.jsonl", &[conv(false, false)]));
    let empty = p(&d.path().join("empty.jsonl"));
    std::fs::write(&empty, "\n").unwrap();
    let out = p(&d.path().join("out.tok"));
    let train = |extra: &[&str]| {
        let mut a = vec!["train", "--run-dir", &run];
        a.extend_from_slice(SMALL);
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let cases: Vec<(Vec<String>, Vec<String>)> = vec![
        // the tokenizer's ids go past the tiny target's vocabulary
        (
            train(&["--tokenizer", &big, "--data", &chat]),
            vec![
                format!("{big}/tokenizer.json: the tokenizer's ids reach"),
                format!("vocab_size is {}", tcfg.vocab_size),
            ],
        ),
        (
            train(&["--tokenizer", &strict, "--data", &chat]),
            vec![format!(
                "{chat}:2: the chat template failed: System role not supported"
            )],
        ),
        (
            train(&["--tokenizer", &broken, "--data", &chat]),
            vec![format!("{broken}/tokenizer_config.json: chat_template does not parse: syntax error: unexpected end of input")],
        ),
        (
            train(&["--tokenizer", &words, "--data", &lonely]),
            vec![format!(
                "{lonely}:1: the conversation has no assistant turn"
            )],
        ),
        (
            train(&["--data", &empty]),
            vec![format!("{empty}: the file is empty")],
        ),
    ];
    for (args, needles) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        refused(&args, &needles);
        assert!(
            !Path::new(&run).exists(),
            "{args:?}: a run directory was made"
        );
        let data = args[args.iter().position(|a| *a == "--data").unwrap() + 1];
        let mut prep = vec!["prepare-data", "--data", data, "--out", &out];
        if let Some(t) = args.iter().position(|a| *a == "--tokenizer") {
            prep.extend(["--tokenizer", args[t + 1]]);
        }
        refused(&prep, &needles);
        assert!(!Path::new(&out).exists(), "{prep:?} left a token file");
        assert!(
            common::leftovers(d.path()).is_empty(),
            "{prep:?} left a temporary file"
        );
    }
}

#[test]
fn conversations_without_an_assistant_turn_are_skipped_and_counted() {
    let d = tempfile::tempdir().unwrap();
    let words = word_dir(&d.path().join("words"), QWEN25, 0);
    let mut rows = chats(5);
    rows.insert(2, json!({"messages": [msg("user", "Hello!")]}));
    rows.push(json!({"messages": [msg("system", "You are terse."), msg("user", "Hello!")]}));
    let src = write(d.path(), "mixed.jsonl", &rows);
    let out = d.path().join("mixed.tok");
    let o = dflash()
        .args(["prepare-data", "--tokenizer"])
        .arg(&words)
        .arg("--data")
        .arg(&src)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let want = format!(
        "warning: {}: skipped 2 conversation(s) with no assistant turn (the first at line 3)",
        src.display()
    );
    assert!(err.contains(&want), "{err}");
    assert!(
        err.contains("prepared") && err.contains(": 5 records"),
        "{err}"
    );
    let help = dflash().args(["prepare-data", "--help"]).output().unwrap();
    assert!(stderr(&help).is_empty());
    assert!(String::from_utf8_lossy(&help.stdout).contains("dflash prepare-data --target"));
}
