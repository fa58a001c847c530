//! The configuration reference (docs/operating/configuration.md) against the program: every
//! flag `freeboard serve --help` prints and every TOML key its parser accepts is in the
//! reference (and every key in `serve.example.toml`), and every flag and `[topics]`/`[tls]` key
//! the reference names exists.
//!
//! The keys come from the parser itself: a file with a key it does not know is refused with
//! the list of keys it does.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

const REFERENCE: &str = "../../docs/operating/configuration.md";

#[test]
fn every_serve_flag_is_in_the_reference_and_every_flag_there_exists() {
    let help = freeboard(&["serve", "--help"]);
    assert!(help.status.success(), "serve --help failed: {}", stderr(&help));
    let help = String::from_utf8(help.stdout).expect("help is UTF-8");
    let flags: BTreeSet<String> = help
        .lines()
        // Option lines are indented by at most 6 columns, their descriptions by 10.
        .filter(|line| line.len() - line.trim_start().len() <= 6)
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| line.split([',', ' ', '=', '[', '<']).find(|w| w.starts_with("--")))
        .map(str::to_owned)
        .filter(|flag| flag != "--help" && flag != "--version")
        .collect();
    assert!(flags.len() > 40 && flags.contains("--memory"), "flags read from --help: {flags:?}");

    let documented = names_in(&reference(), "`--");
    let missing: Vec<_> = flags.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&flags).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{REFERENCE}: flags missing {missing:?}; flags serve does not have {unknown:?}"
    );
}

#[test]
fn every_toml_key_is_in_the_reference_and_every_table_key_there_exists() {
    let reference = reference();
    let named = names_in(&reference, "`");
    let (mut missing, mut unknown) = (Vec::new(), Vec::new());
    for (table, prefix) in TABLES {
        let keys = keys_of(table);
        assert!(keys.len() >= 2, "keys read for {table:?}: {keys:?}");
        missing.extend(
            keys.iter()
                .filter(|key| !is_table(key))
                .map(|key| format!("{prefix}{key}"))
                .filter(|key| !named.contains(key)),
        );
        if !prefix.is_empty() {
            unknown.extend(
                names_in(&reference, &format!("`{prefix}"))
                    .into_iter()
                    .filter(|name| !keys.contains(&name[prefix.len()..])),
            );
        }
    }
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{REFERENCE}: TOML keys missing {missing:?}; keys the parser refuses {unknown:?}"
    );
}

/// `serve.example.toml` shows every key the parser accepts, set or commented out, each in its
/// table, as its first lines promise.
#[test]
fn the_example_file_shows_every_key() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("serve.example.toml");
    let example = std::fs::read_to_string(&path).unwrap();
    let mut shown = BTreeSet::new();
    let mut prefix = String::new();
    for line in example.lines() {
        // A commented-out line is shown too: `# jwt_secret = "…"`, `# [tls]`.
        let line = line.strip_prefix("# ").unwrap_or(line).trim();
        if let Some(table) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            prefix = format!("{table}.");
        } else if let Some((key, _)) = line.split_once(" = ")
            && !key.is_empty()
            && key.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            shown.insert(format!("{prefix}{key}"));
        }
    }
    let mut missing = Vec::new();
    for (table, prefix) in TABLES {
        missing.extend(
            keys_of(table)
                .into_iter()
                .filter(|key| !is_table(key))
                .map(|key| format!("{prefix}{key}"))
                .filter(|key| !shown.contains(key)),
        );
    }
    assert!(missing.is_empty(), "keys missing from serve.example.toml: {missing:?}");
}

/// The configuration's tables: the head that opens each in TOML, and its keys' prefix.
const TABLES: [(&str, &str); 5] = [
    ("", ""),
    ("[topics]\n", "topics."),
    ("[tls]\n", "tls."),
    ("[admin]\n", "admin."),
    ("[routes]\n", "routes."),
];

/// Whether a top-level key names a table.
fn is_table(key: &str) -> bool {
    TABLES.iter().any(|(_, prefix)| prefix.strip_suffix('.') == Some(key))
}

/// The keys the parser accepts in `table` (`""` for the top level), from its answer to a key
/// it does not know: "unknown field `x`, expected one of `a`, `b`, …".
fn keys_of(table: &str) -> BTreeSet<String> {
    // One file per call: the tests run in parallel.
    static PROBES: AtomicUsize = AtomicUsize::new(0);
    let n = PROBES.fetch_add(1, Ordering::Relaxed);
    let file = std::env::temp_dir()
        .join(format!("freeboard-config-reference-{}-{n}.toml", std::process::id()));
    std::fs::write(&file, format!("{table}not_a_setting = 0\n")).unwrap();
    let output = freeboard(&["serve", "--config", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();
    assert!(!output.status.success(), "an unknown key was accepted in {table:?}");
    let error = stderr(&output);
    let (_, expected) =
        error.split_once("expected").unwrap_or_else(|| panic!("no list of keys in: {error}"));
    let expected = expected.lines().next().unwrap_or_default();
    expected.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// Every word of `text` that starts with `start` (a backtick and what follows it, e.g. "`--"),
/// up to its closing backtick or its first space, without the backtick.
fn names_in(text: &str, start: &str) -> BTreeSet<String> {
    text.match_indices(start)
        .map(|(at, _)| {
            let word = &text[at + 1..];
            let end = word.find(['`', ' ']).unwrap_or(word.len());
            word[..end].to_owned()
        })
        .collect()
}

fn reference() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(REFERENCE);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn freeboard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_freeboard")).args(args).output().expect("freeboard runs")
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
