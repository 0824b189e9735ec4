use super::*;

#[test]
fn forced_arguments_hold_declared_keys_only_unless_the_schema_says_so() {
    let open = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let free = json!({"type": "object", "additionalProperties": true});
    let body = Body::parse(
        json!({"tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "weather", "parameters": open}},
            {"type": "function", "function": {"name": "free", "parameters": free}},
            {"type": "function", "function": {"name": "now"}}]})
        .to_string()
        .as_bytes(),
    )
    .expect("body");
    let tools = Tools::parse(&body).expect("tools").expect("some");
    let schema = tools.schema().expect("schema");
    let args = |i: usize| &schema["items"]["anyOf"][i]["properties"]["arguments"];
    assert_eq!(args(0)["additionalProperties"], false);
    assert_eq!(args(1)["additionalProperties"], true);
    assert_eq!(
        args(2),
        &json!({"type": "object", "properties": {}, "additionalProperties": false})
    );
}

#[test]
fn two_tools_of_one_name_are_refused() {
    let f = |name: &str| json!({"type": "function", "function": {"name": name}});
    let body = Body::parse(
        json!({"tools": [f("a"), f("b"), f("a")]})
            .to_string()
            .as_bytes(),
    )
    .expect("body");
    let err = Tools::parse(&body).expect_err("a duplicate");
    let text = format!("{err:?}");
    assert!(text.contains("tools[2] is named 'a'"), "{text}");
}

#[test]
fn a_forced_answer_cut_short_gives_the_calls_begun() {
    let cut = r#"[{"name": "weather", "arguments": {"city": "Pa"#;
    assert_eq!(
        partial_calls(cut),
        vec![ToolCall {
            name: "weather".into(),
            arguments: r#"{"city": "Pa"#.into()
        }]
    );
    assert!(partial_calls(r#"[{"na"#).is_empty());
}

#[test]
fn a_forced_answer_streams_names_then_argument_pieces() {
    let answer = r#"[{"name": "get_weather", "arguments": {"city": "Pa}ris", "n": [1, {"x": 2}]}}, {"name": "get_time", "arguments": {}}]"#;
    // Fed in awkward pieces, the deltas rebuild each call exactly.
    let mut s = CallStream::default();
    let mut deltas = Vec::new();
    for chunk in answer.as_bytes().chunks(3) {
        deltas.extend(s.push(std::str::from_utf8(chunk).expect("ascii")));
    }
    let mut calls: Vec<(String, String)> = Vec::new();
    for d in deltas {
        match d {
            CallDelta::Start { index, name } => {
                assert_eq!(index, calls.len());
                calls.push((name, String::new()));
            }
            CallDelta::Arguments { index, text } => calls[index].1.push_str(&text),
        }
    }
    assert_eq!(
        calls,
        vec![
            (
                "get_weather".into(),
                r#"{"city": "Pa}ris", "n": [1, {"x": 2}]}"#.into()
            ),
            ("get_time".into(), "{}".into()),
        ]
    );
    assert_eq!(s.calls(), 2);
}

/// One tool `f` with open object arguments, under `auto`, parallel calls allowed.
fn auto_f() -> Tools {
    Tools {
        tools: vec![Tool {
            name: "f".into(),
            description: None,
            parameters: json!({"type": "object"}),
        }],
        choice: Choice::Auto,
        parallel: true,
    }
}

#[test]
fn answers_parse_into_calls_of_listed_tools_only() {
    let tools = auto_f();
    let calls = tools
        .parse_output(concat!(
            "<tool_call>[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]</tool_call>\n",
            "<tool_call>{\"name\": \"f\"}</tool_call>"
        ))
        .expect("two calls");
    assert_eq!(calls.len(), 2);
    // A list's arguments as written (as a stream sends them), else as JSON.
    assert_eq!(calls[0].arguments, "{\"a\": 1}");
    assert_eq!(calls[1].arguments, "{}");
    let list =
        r#"[{"name": "f", "arguments": {"a": {"b": [1, "}"]}}}, {"name": "f", "arguments": {}}]"#;
    let whole = tools.parse_output(list).expect("two calls");
    assert_eq!(whole, partial_calls(list), "as streamed");
    assert_eq!(whole[0].arguments, r#"{"a": {"b": [1, "}"]}}"#);
    let one = tools
        .parse_output(r#"{"name": "f", "arguments": {"a": {"b": 1}}}"#)
        .expect("one call");
    assert_eq!(one[0].arguments, r#"{"a":{"b":1}}"#);
    assert!(tools
        .parse_output("Sure.<tool_call>[{\"name\": \"f\"}]</tool_call>")
        .is_none());
    assert!(may_be_call("  <tool") && !may_be_call("Sure"));
    // JSON is held only while it can be a call.
    for held in [
        "[",
        " [ {",
        "{\"na",
        "{ \"name\": \"f",
        "[{\"arguments\": {",
        "{\n",
    ] {
        assert!(may_be_call(held), "{held:?}");
    }
    for content in ["{\"answer\"", "[1, 2]", "{\"n\": 1", "[\"a\"", "{}"] {
        assert!(!may_be_call(content), "{content:?}");
    }
    assert!(tools
        .parse_output("[{\"name\": \"g\", \"arguments\": {}}]")
        .is_none());
    assert!(tools.parse_output("plain text").is_none());
    let schema = tools.schema().expect("schema");
    assert_eq!(schema["minItems"], 1);
    // A tool's $defs move to the root, where its references point.
    let with_defs = Tools {
        tools: vec![Tool {
            name: "f".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
                "$defs": {"P": {"type": "integer"}}}),
        }],
        choice: Choice::Required,
        parallel: false,
    };
    let schema = with_defs.schema().expect("schema");
    assert_eq!(schema["$defs"]["P"]["type"], "integer");
    assert_eq!(schema["maxItems"], 1);
    // A named function is one call, parallel calls allowed or not.
    let named = Tools {
        choice: Choice::Named("f".into()),
        parallel: true,
        ..tools
    };
    assert_eq!(named.schema().expect("schema")["maxItems"], 1);
}

#[test]
fn text_before_calls_is_content_and_one_call_unless_parallel() {
    let mut tools = auto_f();
    let text = "Let me check.\n<tool_call>[{\"name\": \"f\", \"arguments\": {\"a\": 1}}, \
                {\"name\": \"f\", \"arguments\": {\"a\": 2}}]</tool_call>";
    let (content, calls) = tools.answer(text).expect("content and calls");
    assert_eq!(content, "Let me check.\n");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].arguments, "{\"a\": 2}");
    // Calls alone: no content. Text after the calls, or a tag of an unknown tool: content.
    assert_eq!(tools.answer(&text[14..]).expect("calls").0, "");
    assert!(tools.answer(&format!("{text} Done.")).is_none());
    assert!(tools
        .answer("Hi <tool_call>[{\"name\": \"g\"}]</tool_call>")
        .is_none());
    // parallel_tool_calls: false keeps the first call (as vLLM does).
    tools.parallel = false;
    let (_, calls) = tools.answer(text).expect("calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].arguments, "{\"a\": 1}");
}

#[test]
fn content_streams_up_to_a_possible_tag() {
    assert_eq!(tag_start("Sure, let me"), Err(12));
    assert_eq!(tag_start("Sure <"), Err(5));
    assert_eq!(tag_start("Sure <tool_c"), Err(5));
    assert_eq!(tag_start("a < b"), Err(5));
    assert_eq!(tag_start("é<tool_call>[{"), Ok(2));
    assert_eq!(tag_start("<tool_call"), Err(0));
}

#[test]
fn parameters_must_describe_an_object() {
    let with =
        |p: Value| tool(&json!({"type": "function", "function": {"name": "f", "parameters": p}}));
    assert!(with(json!({"type": "object", "properties": {}})).is_ok());
    assert!(with(json!({"type": ["object", "null"]})).is_ok());
    assert!(with(json!({"properties": {"a": {"type": "string"}}})).is_ok());
    let e = with(json!({"type": "string"})).expect_err("a string schema");
    assert!(e.to_string().contains("JSON Schema of an object"), "{e}");
    assert!(with(json!({"type": "array"})).is_err());
}
