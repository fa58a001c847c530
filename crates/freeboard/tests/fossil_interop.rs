//! The Fossil delta codec against the reference the browser SDKs use: the npm package
//! `fossil-delta` (interop/node, installed by `npm ci` there, as scripts/test does) applies
//! freeboard's deltas, and freeboard applies the package's, byte for byte. Skipped (said on
//! stderr) where Node is not installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use freeboard::fossil;

#[test]
fn fossil_delta_npm_package_reads_ours_and_we_read_its() {
    let interop = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop/node");
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("skipped: node is not installed");
        return;
    }
    if !interop.join("node_modules/fossil-delta").exists() {
        let ci = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--silent"])
            .current_dir(&interop)
            .status();
        assert!(ci.is_ok_and(|s| s.success()), "npm ci in interop/node failed");
    }
    let dir = scratch_dir();
    let cases = cases();
    let mut encoder = fossil::Encoder::default();
    let mut delta = Vec::new();
    for (i, (source, target)) in cases.iter().enumerate() {
        fossil::encode(source, target, &mut encoder, &mut delta);
        std::fs::write(dir.join(format!("{i}.source")), source).unwrap();
        std::fs::write(dir.join(format!("{i}.target")), target).unwrap();
        std::fs::write(dir.join(format!("{i}.rust")), &delta).unwrap();
    }
    let out = Command::new("node")
        .arg(interop.join("fossil_delta.js"))
        .arg(&dir)
        .current_dir(&interop)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut applied = Vec::new();
    for (i, (source, target)) in cases.iter().enumerate() {
        let theirs = std::fs::read(dir.join(format!("{i}.node"))).unwrap();
        fossil::apply(source, &theirs, usize::MAX, &mut applied)
            .unwrap_or_else(|e| panic!("case {i}: fossil-delta's delta: {e}"));
        assert_eq!(&applied, target, "case {i}");
        // The two encoders find the same matches on these inputs (same hash, same limits).
        fossil::encode(source, target, &mut encoder, &mut delta);
        assert_eq!(delta.len(), theirs.len(), "case {i}: sizes differ");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Sources and targets: empty, shorter than a hash window, a JSON document with 1 % of it
/// changed, a document reordered, binary with a flipped byte, a target unrelated to its source.
fn cases() -> Vec<(Vec<u8>, Vec<u8>)> {
    let doc = |turn: usize| -> Vec<u8> {
        let fields: Vec<String> = (0..300)
            .map(|i| {
                let v = if i % 100 == 7 { i * 13 + turn } else { i * 13 };
                format!("\"k{i}\":{{\"v\":{v},\"name\":\"ünïcode {i}\"}}")
            })
            .collect();
        format!("{{{}}}", fields.join(",")).into_bytes()
    };
    let binary: Vec<u8> =
        (0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut flipped = binary.clone();
    flipped[10_000] ^= 0x80;
    let mut reordered = doc(1);
    reordered.rotate_left(4000);
    vec![
        (Vec::new(), Vec::new()),
        (b"tiny".to_vec(), b"tiny too".to_vec()),
        (doc(1), doc(2)),
        (doc(2), reordered),
        (binary.clone(), flipped),
        (binary, doc(3)),
        (doc(4), Vec::new()),
    ]
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("freeboard-fossil-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
