//! The repository's README.md shows Rust code that is not compiled where it stands: each of
//! its Rust blocks must appear, line for line, in this crate's README.md, whose examples are
//! compiled with the doctests (`ReadmeDoctests` in `src/lib.rs`).

use std::path::PathBuf;

#[test]
fn the_front_readme_shows_only_compiled_rust() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let read = |path: PathBuf| {
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let front = read(manifest.join("../../README.md"));
    let compiled = read(manifest.join("README.md"));
    let blocks = rust_blocks(&front);
    assert!(!blocks.is_empty(), "README.md has no Rust example");
    for block in blocks {
        assert!(
            compiled.contains(&block),
            "this README.md Rust block is not in crates/freeboard/README.md:\n{block}"
        );
    }
}

/// The bodies of the ```rust blocks of a Markdown text.
fn rust_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut block: Option<String> = None;
    for line in markdown.lines() {
        match &mut block {
            None if line.trim_start().starts_with("```rust") => block = Some(String::new()),
            Some(body) if line.trim_start().starts_with("```") => {
                blocks.push(std::mem::take(body));
                block = None;
            }
            Some(body) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    blocks
}
