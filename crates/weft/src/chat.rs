//! Chat templates: turn a conversation into the prompt text a chat model was trained on.
//!
//! A GGUF file usually carries its model's Jinja template in `tokenizer.chat_template`; we
//! render it with [`minijinja`] the way Hugging Face transformers renders it (`trim_blocks` and
//! `lstrip_blocks` on, `raise_exception` and `strftime_now` available, Python string methods
//! such as `.strip()` through `minijinja-contrib`'s pycompat). When the file has none, a
//! built-in template for the model family is used (see [`ChatTemplate::builtin`]).
//!
//! Key design decision: templates are compiled once, when the [`ChatTemplate`] is built, so a
//! broken template fails at load time rather than at the first request.
//!
//! The rendered text already holds whatever BOS the template writes (Gemma's and Llama's do,
//! ChatML's does not): tokenize it with `add_special = false` and `parse_special = true`, or
//! the prompt gets a second BOS.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{context, syntax::SyntaxConfig, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use weft_core::gguf::GgufFile;
use weft_core::tokenizer::Tokenizer;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `"system"`, `"user"` or `"assistant"` (templates may accept others, e.g. `"tool"`).
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// Why a chat template could not be built or rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatError {
    /// The template does not compile.
    #[error("chat template syntax error: {0}")]
    Syntax(String),
    /// The template failed while rendering (e.g. an undefined value was used).
    #[error("chat template render error: {0}")]
    Render(String),
    /// The template called `raise_exception(message)`, usually to reject the conversation
    /// (for example roles that do not alternate).
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
    /// The file has no template and there is no built-in one for its architecture.
    #[error("no chat template in the model file and none built in for architecture {arch:?}")]
    NoTemplate {
        /// `general.architecture` of the file (empty when absent).
        arch: String,
    },
    /// The model file's metadata could not be read (e.g. the template key is not a string).
    #[error(transparent)]
    Gguf(#[from] weft_core::Error),
}

/// The marker `raise_exception` attaches to its error so that rendering can tell it apart.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// ChatML (SmolLM2, Qwen, ...), without any default system prompt.
const CHATML: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Llama 3 Instruct, as in Meta's `tokenizer_config.json`.
const LLAMA3: &str = "{% for message in messages %}\
{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}\
{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// Llama 2 chat (`[INST]`, `<<SYS>>` folded into the first user turn), as in Meta's template.
const LLAMA2: &str = "{% if messages and messages[0]['role'] == 'system' %}\
{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}\
{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}\
{% for message in loop_messages %}\
{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\
{% if loop.index0 == 0 and system_message != false %}\
{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}\
{% else %}{% set content = message['content'] %}{% endif %}\
{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content | trim + ' [/INST]' }}\
{% elif message['role'] == 'assistant' %}{{ ' ' + content | trim + ' ' + eos_token }}{% endif %}\
{% endfor %}";

/// Gemma (1, 2 and 3): the system message opens the first user turn, assistant is `model`.
const GEMMA: &str = "{{ bos_token }}\
{% if messages and messages[0]['role'] == 'system' %}\
{% set prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}\
{% else %}{% set prefix = '' %}{% set loop_messages = messages %}{% endif %}\
{% for message in loop_messages %}\
{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\
{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}\
{{ (prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// The built-in template for an architecture, given which tokens the vocabulary has.
fn builtin_source(arch: &str, has_token: impl Fn(&str) -> bool) -> Option<&'static str> {
    match arch {
        "llama" if has_token("<|im_start|>") => Some(CHATML),
        "llama" if has_token("<|start_header_id|>") => Some(LLAMA3),
        "llama" => Some(LLAMA2),
        "gemma" | "gemma2" | "gemma3" => Some(GEMMA),
        _ => None,
    }
}

/// A compiled chat template with the special-token texts it is rendered with.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
    /// Weft's template for the model's family, the file having none.
    builtin: bool,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// The model's template: `tokenizer.chat_template` when the file has one, else the
    /// built-in template of its `general.architecture` ([`ChatTemplate::builtin`]).
    pub fn from_gguf(file: &GgufFile, tok: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        let (bos, eos) = special_texts(tok);
        match file.opt_str("tokenizer.chat_template")? {
            Some(src) if !src.trim().is_empty() => ChatTemplate::from_source(src, &bos, &eos),
            _ => ChatTemplate::builtin(file.opt_str("general.architecture")?.unwrap_or(""), tok),
        }
    }

    /// The built-in template of a model family, for files without one: `llama` gets ChatML
    /// when the vocabulary has `<|im_start|>` (SmolLM2), Llama 3's format when it has
    /// `<|start_header_id|>`, else Llama 2's `[INST]`; `gemma`, `gemma2` and `gemma3` get
    /// Gemma's turns with the system message folded into the first user turn. Any other
    /// architecture is [`ChatError::NoTemplate`].
    pub fn builtin(arch: &str, tok: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        let src = builtin_source(arch, |t| tok.vocab().id(t).is_some()).ok_or_else(|| {
            ChatError::NoTemplate {
                arch: arch.to_string(),
            }
        })?;
        let (bos, eos) = special_texts(tok);
        let mut t = ChatTemplate::from_source(src, &bos, &eos)?;
        t.builtin = true;
        Ok(t)
    }

    /// Compiles a Jinja chat template; `bos` and `eos` are the texts of `bos_token` and
    /// `eos_token`. A template that does not compile is [`ChatError::Syntax`].
    ///
    /// ```
    /// use weft::chat::{ChatTemplate, Message};
    /// let t = ChatTemplate::from_source(
    ///     "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content.strip() }}\n{% endfor %}\
    ///      {% if add_generation_prompt %}[assistant] {% endif %}",
    ///     "<s>",
    ///     "</s>",
    /// )?;
    /// let text = t.render(&[Message::user(" Hi! ")], true)?;
    /// assert_eq!(text, "<s>[user] Hi!\n[assistant] ");
    /// # Ok::<(), weft::chat::ChatError>(())
    /// ```
    pub fn from_source(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
        });
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| ChatError::Syntax(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos: bos.to_string(),
            eos: eos.to_string(),
            builtin: false,
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether this is weft's template for the model's family ([`ChatTemplate::builtin`]),
    /// the model file having none of its own — as a pretrained base model has, which answers a
    /// chat poorly.
    pub fn is_builtin(&self) -> bool {
        self.builtin
    }

    /// Renders a conversation. With `add_generation_prompt` the text ends with the opening of
    /// an assistant turn, ready for the model to answer.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        // OpenAI's `developer` role is its `system` one (as the server reads it): no template
        // knows the new name.
        fn role(m: &Message) -> &str {
            match m.role.as_str() {
                "developer" => "system",
                r => r,
            }
        }
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| context! { role => role(m), content => m.content.as_str() })
            .collect();
        self.render_values(Value::from(messages), None, add_generation_prompt)
    }

    /// Renders messages given as JSON (OpenAI's shape: `role`, `content`, and whatever else a
    /// template reads, such as `tool_calls` or `tool_call_id`) with the template's `tools`
    /// variable set to `tools` when given.
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let tools = tools.map(|t| Value::from(t.iter().map(json_value).collect::<Vec<_>>()));
        let messages = Value::from(messages.iter().map(json_value).collect::<Vec<_>>());
        self.render_values(messages, tools, add_generation_prompt)
    }

    /// Whether the template reads a `tools` variable (it can list tools in the prompt itself).
    pub fn supports_tools(&self) -> bool {
        self.source.contains("tools")
    }

    fn render_values(
        &self,
        messages: Value,
        tools: Option<Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let ctx = context! {
            messages,
            tools,
            add_generation_prompt,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        };
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatError::Render(e.to_string()))?;
        let text = template.render(ctx).map_err(|e| {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(c) = cause {
                if let Some(Raised(msg)) = c.downcast_ref::<Raised>() {
                    return ChatError::Raised(msg.clone());
                }
                cause = c.source();
            }
            ChatError::Render(e.to_string())
        })?;
        // A prompt to generate from that holds nothing: no pass could say why.
        if text.is_empty() && add_generation_prompt {
            return Err(ChatError::Render(
                "the template rendered the conversation as empty text (the model file's \
                 chat template is broken)"
                    .into(),
            ));
        }
        Ok(text)
    }
}

/// A JSON value as a template value (objects keep serde_json's key order).
fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::from(a.iter().map(json_value).collect::<Vec<_>>()),
        J::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), json_value(v)))),
    }
}

/// The texts of the tokenizer's BOS and EOS tokens (empty when the model has none).
fn special_texts(tok: &Tokenizer) -> (String, String) {
    let text = |id: Option<u32>| {
        id.and_then(|id| tok.token_to_piece(id, true).ok())
            .unwrap_or_default()
    };
    let special = tok.vocab().special();
    (text(special.bos), text(special.eos))
}

/// The model's end-of-generation tokens: EOS and the end-of-turn tokens of known chat formats
/// (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`, ...), as llama.cpp computes them.
pub fn stop_tokens(tok: &Tokenizer) -> Vec<u32> {
    tok.vocab().eog().to_vec()
}

/// `strftime_now(format)`: the current UTC time formatted with the common `strftime`
/// directives (`%Y %y %m %d %e %B %b %A %a %H %I %M %S %p %j %%`).
fn strftime_now(fmt: &str) -> Result<String, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    Ok(format_time(secs, fmt))
}

/// Formats a Unix time (UTC) with a subset of `strftime`; unknown directives are kept as is.
fn format_time(secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][month as usize - 1];
    let yday = before + day + i64::from(leap && month > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let name = MONTHS[month as usize - 1];
        match chars.next() {
            Some('Y') => out += &year.to_string(),
            Some('y') => out += &format!("{:02}", year.rem_euclid(100)),
            Some('m') => out += &format!("{month:02}"),
            Some('d') => out += &format!("{day:02}"),
            Some('e') => out += &format!("{day:2}"),
            Some('B') => out += name,
            Some('b') => out += &name[..3],
            Some('A') => out += DAYS[weekday],
            Some('a') => out += &DAYS[weekday][..3],
            Some('H') => out += &format!("{hour:02}"),
            Some('I') => out += &format!("{:02}", (hour + 11) % 12 + 1),
            Some('M') => out += &format!("{minute:02}"),
            Some('S') => out += &format!("{second:02}"),
            Some('p') => out += if hour < 12 { "AM" } else { "PM" },
            Some('j') => out += &format!("{yday:03}"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builtin(arch: &str, vocab: &[&str], bos: &str, eos: &str) -> ChatTemplate {
        let src = builtin_source(arch, |t| vocab.contains(&t)).expect("a built-in template");
        ChatTemplate::from_source(src, bos, eos).expect("built-in templates compile")
    }

    fn chat() -> Vec<Message> {
        vec![
            Message::system("Be brief."),
            Message::user("Hi"),
            Message::assistant("Hello!"),
            Message::user("Bye"),
        ]
    }

    #[test]
    fn chatml_for_llama_with_im_start() {
        let t = builtin("llama", &["<|im_start|>"], "<|im_start|>", "<|im_end|>");
        assert_eq!(
            t.render(&chat(), true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn llama3_for_llama_with_header_tokens() {
        let t = builtin(
            "llama",
            &["<|start_header_id|>"],
            "<|begin_of_text|>",
            "<|eot_id|>",
        );
        assert_eq!(
            t.render(&chat()[..2], true).unwrap(),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn llama2_otherwise() {
        let t = builtin("llama", &[], "<s>", "</s>");
        assert_eq!(
            t.render(&chat(), false).unwrap(),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]"
        );
        let bad = [Message::user("a"), Message::user("b")];
        assert!(
            matches!(t.render(&bad, false), Err(ChatError::Raised(m)) if m.contains("alternate"))
        );
    }

    #[test]
    fn gemma_folds_system_into_first_user_turn() {
        for arch in ["gemma", "gemma2", "gemma3"] {
            let t = builtin(arch, &[], "<bos>", "<eos>");
            assert_eq!(
                t.render(&chat(), true).unwrap(),
                "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
                 <start_of_turn>model\nHello!<end_of_turn>\n\
                 <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
            );
            assert_eq!(
                t.render(&[Message::user(" Hi ")], false).unwrap(),
                "<bos><start_of_turn>user\nHi<end_of_turn>\n"
            );
        }
    }

    #[test]
    fn template_is_shareable_across_threads() {
        fn check<T: Send + Sync + Clone>() {}
        check::<ChatTemplate>();
    }

    #[test]
    fn unknown_architecture_has_no_builtin() {
        assert!(builtin_source("mamba", |_| true).is_none());
    }

    #[test]
    fn errors_are_typed() {
        assert!(matches!(
            ChatTemplate::from_source("{% for m in messages %}", "", ""),
            Err(ChatError::Syntax(_))
        ));
        let t = ChatTemplate::from_source("{{ messages[0].content.nope() }}", "", "").unwrap();
        assert!(matches!(
            t.render(&[Message::user("x")], false),
            Err(ChatError::Render(_))
        ));
    }

    #[test]
    fn trim_and_lstrip_blocks_as_transformers() {
        let t = ChatTemplate::from_source(
            "  {% for m in messages %}\n{{ m.content }}\n  {% endfor %}\n",
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            t.render(&[Message::user("a"), Message::user("b")], false)
                .unwrap(),
            "a\nb\n"
        );
    }

    #[test]
    fn strftime_subset() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(
            format_time(t, "%d %b %Y %H:%M:%S %a %j %B %y %I%p %%"),
            "29 Feb 2024 13:05:09 Thu 060 February 24 01PM %"
        );
        assert_eq!(format_time(0, "%A %e %m"), "Thursday  1 01");
        let now = ChatTemplate::from_source("{{ strftime_now('%Y') }}", "", "").unwrap();
        assert_eq!(now.render(&[], false).unwrap().len(), 4);
    }
}
