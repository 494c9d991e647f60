//! Chat templates: a conversation rendered to text the way the target was fine-tuned on
//! it, with the byte spans of the assistant's turns, from which the loss mask is made.
//!
//! The template is the `chat_template` Jinja string of the target's
//! `tokenizer_config.json` (or its `chat_template.jinja`), rendered with `minijinja` as
//! Hugging Face's `apply_chat_template` renders it with Jinja2: `trim_blocks` and
//! `lstrip_blocks` on, loop controls, Python string methods (`strip`, `startswith`,
//! `split`, ...) through `minijinja-contrib`'s pycompat, a `raise_exception(message)`
//! function, and the context `messages`, `add_generation_prompt`, and the special tokens
//! (`bos_token`, `eos_token`, `pad_token`, `unk_token`) the configuration names.
//! `strftime_now` is deliberately not defined, so templates that would print today's date
//! use their fixed fallback and a conversation renders the same on every day.
//!
//! **How the assistant spans are found** (prefix rendering, with a content search where
//! a template rewrites the last turn): the whole conversation is rendered once (`full`).
//! For the assistant message at index `i`:
//!
//! - it starts where the prompt for it ends: the rendering of `messages[..i]` with
//!   `add_generation_prompt = true`, which must be a prefix of `full` (so the generation
//!   prompt, e.g. `<|im_start|>assistant\n`, is not part of the span);
//! - it ends where the rendering of `messages[..=i]` ends, when that rendering is a
//!   prefix of `full` (most templates: the span is the content and the end-of-turn text,
//!   e.g. `...<|im_end|>\n` or `...<|eot_id|>`);
//! - otherwise the template renders a last assistant turn differently from an earlier one
//!   (Qwen3 drops the reasoning of earlier turns and gives the last an empty `<think>`
//!   block; DeepSeek-R1 likewise): the turn ends after the first `eos_token` (e.g.
//!   `<|im_end|>`) in `full` after the span's start, and the text that follows the
//!   `eos_token` at the end of the `messages[..=i]` rendering (e.g. `\n`) where `full` has
//!   it too; without an `eos_token` in that rendering, after the message's content found in
//!   `full` (as written, or trimmed) and that same trailing text.
//!
//! A template whose rendering of earlier messages depends on later ones in any other way
//! is refused for that conversation (the error says which turn).
use std::collections::BTreeMap;
use std::ops::Range;

use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value};
use serde_json::Value as Json;

const NAME: &str = "chat_template";

/// A compiled chat template and the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    specials: BTreeMap<String, String>,
}

/// A rendered conversation and the byte ranges of its assistant turns, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub text: String,
    pub spans: Vec<Range<usize>>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("specials", &self.specials)
            .finish_non_exhaustive()
    }
}

/// One line of a template error (minijinja's message and where in the template).
fn one_line(e: &minijinja::Error) -> String {
    let mut s = match e.kind() {
        // raise_exception's message as the template wrote it
        ErrorKind::InvalidOperation => e.detail().unwrap_or("invalid operation").to_string(),
        _ => e.to_string(),
    };
    if let (ErrorKind::InvalidOperation, Some(line)) = (e.kind(), e.line()) {
        s.push_str(&format!(" (chat_template line {line})"));
    }
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    /// Compiles `source`; `specials` maps `bos_token`, `eos_token`, ... to their text.
    pub fn new(source: &str, specials: BTreeMap<String, String>) -> Result<Self, String> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| one_line(&e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| format!("chat_template does not parse: {}", one_line(&e)))?;
        Ok(Self { env, specials })
    }

    /// Renders `messages` (each a JSON object with at least `role`).
    pub fn render(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let mut ctx: BTreeMap<&str, Value> = self
            .specials
            .iter()
            .map(|(k, v)| (k.as_str(), Value::from(v.as_str())))
            .collect();
        ctx.insert("messages", Value::from(messages.to_vec()));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        let tmpl = self.env.get_template(NAME).map_err(|e| one_line(&e))?;
        tmpl.render(ctx)
            .map_err(|e| format!("the chat template failed: {}", one_line(&e)))
    }

    /// Renders a conversation and finds its assistant turns (see the module header).
    pub fn render_spans(&self, messages: &[Json]) -> Result<Rendered, String> {
        let values: Vec<Value> = messages.iter().map(|m| Value::from(Serde(m))).collect();
        let text = self.render(&values, false)?;
        let mut spans: Vec<Range<usize>> = Vec::new();
        let mut turn = 0;
        for (i, m) in messages.iter().enumerate() {
            if role(m) != Some("assistant") {
                continue;
            }
            turn += 1;
            let before = self.render(&values[..i], true)?;
            let floor = spans.last().map_or(0, |s| s.end);
            if !text.starts_with(&before) || before.len() < floor {
                return Err(format!(
                    "the chat template renders the messages before assistant turn {turn} differently once later messages follow, so that turn's tokens cannot be located"
                ));
            }
            let start = before.len();
            let upto = self.render(&values[..=i], false)?;
            let end = if text.starts_with(&upto) && upto.len() >= start {
                upto.len()
            } else {
                let eos = self.specials.get("eos_token").map(String::as_str);
                turn_end(&text, start, upto.get(start..).unwrap_or(""), m, eos).ok_or_else(|| {
                    format!(
                        "cannot find where assistant turn {turn} ends in the rendered conversation (the chat template renders it differently as the last message, and it has no eos_token there)"
                    )
                })?
            };
            spans.push(start..end);
        }
        Ok(Rendered { text, spans })
    }
}

/// A message's role, if it has one.
pub fn role(m: &Json) -> Option<&str> {
    m.get("role").and_then(Json::as_str)
}

/// Where an assistant turn that starts at `start` ends in `full` when its rendering as the
/// last message, `last`, differs from its rendering there: after the first `eos` in
/// `full[start..]` when `last` has one, else after the message's content; then over what
/// `last` writes after that point, where `full` has it too.
fn turn_end(full: &str, start: usize, last: &str, m: &Json, eos: Option<&str>) -> Option<usize> {
    let rest = &full[start..];
    let (end, after) = match eos.filter(|e| !e.is_empty() && last.contains(*e)) {
        Some(e) => {
            let at = rest.find(e)? + e.len();
            (at, &last[last.rfind(e)? + e.len()..])
        }
        None => {
            let content = m.get("content").and_then(Json::as_str).unwrap_or("");
            let (at, c) = [content, content.trim()]
                .into_iter()
                .find_map(|c| rest.find(c).map(|at| (at, c)))?;
            (
                at + c.len(),
                last.rfind(c).map_or("", |p| &last[p + c.len()..]),
            )
        }
    };
    Some(
        start
            + end
            + if rest[end..].starts_with(after) {
                after.len()
            } else {
                0
            },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    fn conv() -> Vec<Json> {
        vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "hello"}),
            json!({"role": "user", "content": "bye"}),
            json!({"role": "assistant", "content": "ciao"}),
        ]
    }

    #[test]
    fn spans_cover_the_assistant_content_and_the_end_of_turn() {
        let t = ChatTemplate::new(CHATML, BTreeMap::new()).unwrap();
        let r = t.render_spans(&conv()).unwrap();
        let got: Vec<&str> = r.spans.iter().map(|s| &r.text[s.clone()]).collect();
        assert_eq!(got, ["hello<|im_end|>\n", "ciao<|im_end|>\n"]);
    }

    #[test]
    fn a_template_that_rewrites_the_last_turn_is_located_by_content() {
        // like Qwen3: only the last assistant turn gets an empty think block
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and loop.last %}<think>\n\n</think>\n\n{% endif %}{{ m.content | trim }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src, BTreeMap::new()).unwrap();
        let mut c = conv();
        c[1]["content"] = json!(" hello ");
        let r = t.render_spans(&c).unwrap();
        let got: Vec<&str> = r.spans.iter().map(|s| &r.text[s.clone()]).collect();
        assert_eq!(
            got,
            [
                "hello<|im_end|>\n",
                "<think>\n\n</think>\n\nciao<|im_end|>\n"
            ]
        );
    }

    #[test]
    fn a_turn_rewritten_beyond_its_content_ends_at_the_eos_token() {
        // like Qwen3: earlier turns lose their reasoning, the last keeps it
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let mut c = conv();
        c[1]["content"] = json!("<think>sum</think>hello");
        let none = ChatTemplate::new(src, BTreeMap::new()).unwrap();
        let e = none.render_spans(&c).unwrap_err();
        assert!(e.contains("cannot find where assistant turn 1 ends"), "{e}");
        let eos = BTreeMap::from([("eos_token".to_string(), "<|im_end|>".to_string())]);
        let t = ChatTemplate::new(src, eos).unwrap();
        let r = t.render_spans(&c).unwrap();
        let got: Vec<&str> = r.spans.iter().map(|s| &r.text[s.clone()]).collect();
        assert_eq!(got, ["hello<|im_end|>\n", "ciao<|im_end|>\n"]);
    }

    #[test]
    fn raise_exception_and_syntax_errors_are_one_line() {
        let src = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}x";
        let t = ChatTemplate::new(src, BTreeMap::new()).unwrap();
        let e = t
            .render_spans(&[json!({"role": "system", "content": "s"})])
            .unwrap_err();
        assert!(
            e.starts_with("the chat template failed: System role not supported"),
            "{e}"
        );
        let e = ChatTemplate::new("{% for %}", BTreeMap::new()).unwrap_err();
        assert!(e.starts_with("chat_template does not parse"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn pycompat_methods_and_specials_are_available() {
        let src = "{{ bos_token }}{% for m in messages %}{{ m.content.strip().upper() }}{% if m.content.startswith(' a') %}!{% endif %}{% endfor %}";
        let specials = BTreeMap::from([("bos_token".to_string(), "<s>".to_string())]);
        let t = ChatTemplate::new(src, specials).unwrap();
        let v = [Value::from(Serde(
            json!({"role": "user", "content": " abc "}),
        ))];
        assert_eq!(t.render(&v, false).unwrap(), "<s>ABC!");
    }
}
