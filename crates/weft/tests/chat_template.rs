//! Chat templates on the real models (SmolLM2-135M-Instruct, Gemma 3 270M), checked against
//! prompt strings written by hand from the models' published prompt formats.

use crate::common;

use weft::chat::{stop_tokens, ChatError, ChatTemplate, Message};
use weft::{GgufFile, Tokenizer};

fn load(name: &str) -> (GgufFile, Tokenizer) {
    let file = common::open_model(name);
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    (file, tok)
}

/// system, user, assistant, user.
fn chat() -> Vec<Message> {
    vec![
        Message::system("You are terse."),
        Message::user("What is 2+2?"),
        Message::assistant("4"),
        Message::user("And 3+3?"),
    ]
}

/// Gemma 3's official chat template, verbatim from the `tokenizer_config.json` of Google's
/// instruction-tuned Gemma 3 models (the 270M GGUF we use carries no template of its own).
const GEMMA3_OFFICIAL: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#;

#[test]
fn smollm2_template_from_gguf_is_chatml() {
    let (file, tok) = load("smollm2-135m");
    let t = ChatTemplate::from_gguf(&file, &tok).expect("template");
    assert!(!t.is_builtin(), "the file's own template");
    let turns = "<|im_start|>system\nYou are terse.<|im_end|>\n\
                 <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
                 <|im_start|>assistant\n4<|im_end|>\n\
                 <|im_start|>user\nAnd 3+3?<|im_end|>\n";
    assert_eq!(t.render(&chat(), false).unwrap(), turns);
    assert_eq!(
        t.render(&chat(), true).unwrap(),
        format!("{turns}<|im_start|>assistant\n")
    );
    // Without a system message SmolLM2's template supplies its default one.
    assert_eq!(
        t.render(&[Message::user("Hi")], true).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn gemma3_template_folds_system_into_first_turn() {
    let (file, tok) = load("gemma3-270m");
    assert!(
        file.get("tokenizer.chat_template").is_none(),
        "this GGUF now has a template: the built-in is no longer what from_gguf uses"
    );
    let t = ChatTemplate::from_gguf(&file, &tok).expect("template");
    // What `weft chat` and `weft serve` warn about: a base model with weft's template.
    assert!(t.is_builtin());
    let turns = "<bos><start_of_turn>user\nYou are terse.\n\nWhat is 2+2?<end_of_turn>\n\
                 <start_of_turn>model\n4<end_of_turn>\n\
                 <start_of_turn>user\nAnd 3+3?<end_of_turn>\n";
    assert_eq!(t.render(&chat(), false).unwrap(), turns);
    assert_eq!(
        t.render(&chat(), true).unwrap(),
        format!("{turns}<start_of_turn>model\n")
    );
    // OpenAI's `developer` role is `system`, as the server reads it (the template refused
    // it: roles must alternate).
    let mut developer = chat();
    developer[0] = Message::new("developer", "You are terse.");
    assert_eq!(t.render(&developer, false).unwrap(), turns);
}

#[test]
fn builtin_chatml_matches_smollm2_template() {
    let (file, tok) = load("smollm2-135m");
    let real = ChatTemplate::from_gguf(&file, &tok).unwrap();
    let builtin = ChatTemplate::builtin("llama", &tok).unwrap();
    assert_ne!(real.source(), builtin.source());
    // The built-in ChatML has no SmolLM-specific default system prompt, so compare
    // conversations that bring their own.
    for msgs in [chat(), chat()[..2].to_vec(), chat()[..3].to_vec()] {
        for gen in [false, true] {
            assert_eq!(
                builtin.render(&msgs, gen).unwrap(),
                real.render(&msgs, gen).unwrap()
            );
        }
    }
}

#[test]
fn builtin_gemma_matches_official_gemma3_template() {
    let (_, tok) = load("gemma3-270m");
    let bos = tok
        .token_to_piece(tok.vocab().special().bos.unwrap(), true)
        .unwrap();
    let eos = tok
        .token_to_piece(tok.vocab().special().eos.unwrap(), true)
        .unwrap();
    assert_eq!((bos.as_str(), eos.as_str()), ("<bos>", "<eos>"));
    let official = ChatTemplate::from_source(GEMMA3_OFFICIAL, &bos, &eos).unwrap();
    for arch in ["gemma3", "gemma2", "gemma"] {
        let builtin = ChatTemplate::builtin(arch, &tok).unwrap();
        let untrimmed = vec![Message::user("  Hello\n"), Message::assistant("\tHi! ")];
        for msgs in [
            chat(),
            chat()[1..].to_vec(),
            chat()[..2].to_vec(),
            untrimmed,
        ] {
            for gen in [false, true] {
                assert_eq!(
                    builtin.render(&msgs, gen).unwrap(),
                    official.render(&msgs, gen).unwrap()
                );
            }
        }
    }
}

#[test]
fn rendered_prompt_carries_its_own_bos() {
    // Gemma's template writes `<bos>` and the file asks for BOS on encoding: tokenize the
    // prompt with add_special = false, or it starts with two.
    let (file, tok) = load("gemma3-270m");
    let bos = tok.vocab().special().bos.unwrap();
    let text = ChatTemplate::from_gguf(&file, &tok)
        .unwrap()
        .render(&chat(), true)
        .unwrap();
    let ids = tok.encode(&text, false, true);
    assert_eq!(ids.iter().filter(|&&i| i == bos).count(), 1);
    assert_eq!(ids[0], bos);
    assert_eq!(&tok.encode(&text, true, true)[..2], &[bos, bos]);
    // SmolLM2's ChatML writes none and its file adds none.
    let (file, tok) = load("smollm2-135m");
    let text = ChatTemplate::from_gguf(&file, &tok)
        .unwrap()
        .render(&chat(), true)
        .unwrap();
    let im_start = tok.vocab().id("<|im_start|>").unwrap();
    assert_eq!(tok.encode(&text, true, true)[0], im_start);
}

#[test]
fn invalid_template_fails_at_construction() {
    for src in [
        "{% for m in messages %}{{ m.content }}",
        "{{ messages[0 }}",
        "{% if %}x{% endif %}",
    ] {
        match ChatTemplate::from_source(src, "<s>", "</s>") {
            Err(ChatError::Syntax(msg)) => assert!(!msg.is_empty()),
            other => panic!("{src:?}: expected a syntax error, got {other:?}"),
        }
    }
}

/// A template that renders a prompt as nothing says so (the pass would only say that it has
/// no input tokens).
#[test]
fn an_empty_rendering_is_a_render_error() {
    let t = ChatTemplate::from_source("", "<s>", "</s>").expect("an empty template compiles");
    let err = t.render(&[Message::user("Hi")], true).expect_err("empty");
    assert!(
        matches!(&err, ChatError::Render(m) if m.contains("empty text")),
        "{err}"
    );
}

#[test]
fn raise_exception_is_typed() {
    let t = ChatTemplate::from_source(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first, please') }}\
         {% endif %}ok",
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.render(&[Message::user("x")], false).unwrap(), "ok");
    match t.render(&[Message::assistant("x")], false) {
        Err(ChatError::Raised(msg)) => assert_eq!(msg, "user first, please"),
        other => panic!("expected Raised, got {other:?}"),
    }
    // The official Gemma 3 template rejects roles that do not alternate.
    let official = ChatTemplate::from_source(GEMMA3_OFFICIAL, "<bos>", "<eos>").unwrap();
    let twice = [Message::user("a"), Message::user("b")];
    assert!(matches!(
        official.render(&twice, true),
        Err(ChatError::Raised(m)) if m.contains("alternate")
    ));
}

#[test]
fn stop_tokens_include_end_of_turn() {
    for (name, end_of_turn) in [
        ("smollm2-135m", "<|im_end|>"),
        ("gemma3-270m", "<end_of_turn>"),
    ] {
        let (_, tok) = load(name);
        let stops = stop_tokens(&tok);
        let id = tok
            .vocab()
            .id(end_of_turn)
            .expect("end-of-turn token in vocabulary");
        assert!(
            stops.contains(&id),
            "{name}: {end_of_turn} ({id}) not in {stops:?}"
        );
        let eos = tok.vocab().special().eos.expect("EOS");
        assert!(stops.contains(&eos), "{name}: EOS {eos} not in {stops:?}");
    }
}
