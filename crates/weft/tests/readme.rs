//! The README's Rust blocks are the example `examples/readme.rs` word for word (which `cargo
//! test` compiles), so what the README shows compiles against the API.

#[test]
fn every_rust_block_of_the_readme_is_in_the_readme_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let example = std::fs::read_to_string(format!("{root}/crates/weft/examples/readme.rs"))
        .expect("examples/readme.rs");
    // The example's function bodies, one indentation level out.
    let unindented: String = example
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut blocks = 0;
    let mut rest = readme.as_str();
    while let Some(start) = rest.find("```rust\n") {
        let body = &rest[start + "```rust\n".len()..];
        let end = body.find("```").expect("a closed rust block");
        let block = &body[..end];
        assert!(
            unindented.contains(block),
            "this README block is not in crates/weft/examples/readme.rs:\n{block}"
        );
        blocks += 1;
        rest = &body[end + 3..];
    }
    assert!(blocks >= 2, "the README's rust blocks were not found");
}
