//! The manifests the binary generates, compared with the committed ones.

use std::path::Path;

/// Every file under `dir` as (path relative to `dir`, content), sorted by path.
pub fn files_in(dir: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    files_under(dir, dir, &mut files);
    files.sort();
    files
}

fn files_under(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("entry").path();
        if p.is_dir() {
            files_under(root, &p, out);
        } else {
            let name = p.strip_prefix(root).expect("under root").to_string_lossy().into_owned();
            out.push((name, std::fs::read_to_string(&p).expect("read")));
        }
    }
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
