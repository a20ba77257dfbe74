//! The manifests the binary generates, compared with the committed ones.

use std::path::Path;

/// The files of `dir` as (name, content), sorted by name.
pub fn files_in(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let e = e.expect("entry");
            (e.file_name().to_string_lossy().into_owned(), std::fs::read_to_string(e.path()).expect("read"))
        })
        .collect();
    files.sort();
    files
}

/// What `migration-apiserver <command> --output-dir <dir>` writes (it must succeed), as [`files_in`] reads it.
pub fn generated(command: &str) -> Vec<(String, String)> {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(super::BIN)
        .args([command, "--output-dir"])
        .arg(tmp.path())
        .output()
        .unwrap_or_else(|e| panic!("run migration-apiserver {command}: {e}"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    files_in(tmp.path())
}
