//! The container image's Dockerfile (manifests/image/Dockerfile), read as `docker build` would read it. No registry
//! can be reached here, so nothing is built: the test lays out exactly what the build stage copies (its COPY lines,
//! through .dockerignore) in a temporary directory and checks that cargo resolves the workspace there, locked and
//! offline; that protoc is installed before the build; that the build's toolchain is new enough for every locked
//! package; and that the final stage copies the binary the build stage produces and runs it as non-root.

mod common;
use common::repo;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One instruction: its keyword (upper case) and arguments, continuation lines joined.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

#[derive(Debug)]
struct Stage {
    image: String,
    name: Option<String>,
    instructions: Vec<Instruction>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.instructions.iter().filter(move |i| i.keyword == keyword).map(|i| i.args.as_str())
    }
    fn last<'a>(&'a self, keyword: &'a str) -> Option<&'a str> {
        self.all(keyword).last()
    }
}

fn parse_dockerfile(text: &str) -> Vec<Stage> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if trimmed.starts_with('#') {
            continue; // a comment inside a continued instruction
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for line in logical {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let (keyword, args) = (keyword.to_ascii_uppercase(), args.trim().to_string());
        if keyword == "FROM" {
            let words: Vec<&str> = args.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                _ => None,
            };
            stages.push(Stage { image: words[0].to_string(), name, instructions: Vec::new() });
        } else {
            let stage = stages.last_mut().expect("an instruction before the first FROM");
            stage.instructions.push(Instruction { keyword, args });
        }
    }
    stages
}

/// `COPY [--from=x] src... dest`: the flags, the sources and the destination.
fn copy_parts(args: &str) -> (Vec<&str>, Vec<&str>, &str) {
    let words: Vec<&str> = args.split_whitespace().collect();
    let (flags, paths): (Vec<&str>, Vec<&str>) = words.into_iter().partition(|w| w.starts_with("--"));
    let (dest, sources) = paths.split_last().expect("COPY needs a source and a destination");
    (flags, sources.to_vec(), dest)
}

/// Whether .dockerignore leaves `path` (relative to the context) in the build context: the last pattern that
/// matches decides, `!` re-includes. The patterns used here are `*` and plain paths (a directory with a trailing
/// slash), which is all this check understands; any other pattern fails the test.
fn in_context(ignore: &str, path: &str) -> bool {
    let mut included = true;
    for line in ignore.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (include, pattern) = match line.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, line),
        };
        let pattern = pattern.trim_end_matches('/');
        assert!(
            pattern == "*" || !pattern.contains(['*', '?', '[']),
            ".dockerignore pattern {line:?} is beyond this test's reading"
        );
        if pattern == "*" || path == pattern || path.starts_with(&format!("{pattern}/")) {
            included = include;
        }
    }
    included
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read_dir") {
            let entry = entry.expect("entry");
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        // As docker does, a file copied to a path whose directories do not exist yet creates them.
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

/// Every file the server's sources include at compile time (`include_str!`/`include_bytes!` of a literal path,
/// relative to the including file), as a path under the repository root.
fn compile_time_includes() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut sources = Vec::new();
    walk(&repo().join("src"), &mut sources);
    let mut includes = Vec::new();
    for source in sources {
        let text = std::fs::read_to_string(&source).expect("read");
        for macro_call in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in text.match_indices(macro_call) {
                let rest = &text[at + macro_call.len()..];
                let literal = &rest[..rest.find('"').expect("closing quote")];
                let path = source.parent().expect("dir").join(literal);
                let path = path.canonicalize().unwrap_or_else(|e| panic!("{}: {literal}: {e}", source.display()));
                let root = repo().canonicalize().expect("repo");
                let relative = path.strip_prefix(&root).expect("inside the repository");
                includes.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    includes
}

/// The host's target triple: the build stage's image is a Linux one like this machine.
fn host_triple() -> String {
    let out = Command::new("rustc").arg("-vV").output().expect("rustc -vV");
    let text = String::from_utf8(out.stdout).expect("utf8");
    text.lines().find_map(|l| l.strip_prefix("host: ")).expect("host line").to_string()
}

fn version_tuple(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or_else(|_| panic!("version {v:?}"))).collect()
}

struct Checked {
    stages: Vec<Stage>,
    build: usize,
}

fn dockerfile() -> Checked {
    let text = std::fs::read_to_string(repo().join("manifests/image/Dockerfile")).expect("read the Dockerfile");
    let stages = parse_dockerfile(&text);
    assert!(stages.len() >= 2, "a build stage and a final stage: {stages:?}");
    let build = stages
        .iter()
        .position(|s| s.all("RUN").any(|r| r.contains("cargo build")))
        .expect("a stage that runs cargo build");
    assert!(build < stages.len() - 1, "the final stage only copies the binary; cargo builds in an earlier one");
    Checked { stages, build }
}

/// The build stage's copies laid out in a directory: what cargo sees in the image.
fn lay_out_build_context(stage: &Stage) -> (tempfile::TempDir, PathBuf) {
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap_or_default();
    let tmp = tempfile::tempdir().expect("tempdir");
    let workdir = stage.last("WORKDIR").expect("the build stage sets WORKDIR");
    let root = tmp.path().join(workdir.trim_start_matches('/'));
    std::fs::create_dir_all(&root).expect("mkdir");
    for copy in stage.all("COPY") {
        let (flags, sources, dest) = copy_parts(copy);
        assert!(flags.is_empty(), "the build stage copies from the context only: COPY {copy}");
        for source in sources {
            let source = source.trim_end_matches('/');
            assert!(in_context(&ignore, source), "COPY {source}: .dockerignore leaves it out of the build context");
            let from = repo().join(source);
            assert!(from.exists(), "COPY {source}: no such file in the repository");
            let to = if dest.ends_with('/') || sources_len(copy) > 1 {
                root.join(dest).join(Path::new(source).file_name().expect("name"))
            } else {
                root.join(dest)
            };
            copy_tree(&from, &to);
        }
    }
    (tmp, root)
}

fn sources_len(copy: &str) -> usize {
    copy_parts(copy).1.len()
}

/// The cargo build command's profile directory under target/: `release` for --release, else the profile's name.
fn profile_dir(cargo_build: &str) -> String {
    let words: Vec<&str> = cargo_build.split_whitespace().collect();
    if words.contains(&"--release") {
        return "release".into();
    }
    let i = words.iter().position(|w| *w == "--profile").expect("cargo build names --release or --profile");
    words[i + 1].to_string()
}

#[test]
fn the_build_stage_resolves_the_workspace_from_what_it_copies() {
    let Checked { stages, build } = dockerfile();
    let stage = &stages[build];
    let (_tmp, root) = lay_out_build_context(stage);
    // What the sources include at compile time is copied too (the recommended audit policy, for one).
    let includes = compile_time_includes();
    assert!(includes.iter().any(|i| i == "manifests/audit/policy.yaml"), "{includes:?}");
    for include in &includes {
        assert!(root.join(include).is_file(), "{include} is included at compile time but the build stage lacks it");
    }
    let out = Command::new("cargo")
        .args(["metadata", "--locked", "--offline", "--format-version", "1", "--filter-platform"])
        .arg(host_triple())
        .current_dir(&root)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo cannot resolve the workspace from the build stage's copies: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let server = packages.iter().find(|p| p["name"] == "migration-apiserver").expect("the server package");
    assert!(
        server["targets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "migration-apiserver" && t["kind"].as_array().unwrap().iter().any(|k| k == "bin")),
        "the copied workspace has the migration-apiserver binary"
    );

    // The toolchain of the build stage's image is no older than any locked package asks for.
    let image = &stage.image;
    let tag = image.strip_prefix("rust:").unwrap_or_else(|| panic!("the build stage uses the rust image: {image}"));
    let toolchain = version_tuple(tag.split('-').next().expect("version"));
    for p in packages {
        if let Some(needed) = p["rust_version"].as_str() {
            let mut needed = version_tuple(needed);
            needed.resize(toolchain.len(), 0);
            assert!(toolchain >= needed, "{image} is older than {} needs ({needed:?})", p["name"]);
        }
    }
}

#[test]
fn protoc_is_installed_before_the_locked_build() {
    let Checked { stages, build } = dockerfile();
    let runs: Vec<&str> = stages[build].all("RUN").collect();
    let cargo = runs.iter().position(|r| r.contains("cargo build")).expect("cargo build");
    let protoc = runs.iter().position(|r| r.contains("apt-get install") && r.contains("protobuf-compiler"));
    assert!(
        matches!(protoc, Some(i) if i < cargo),
        "etcd-client's build needs protoc: install protobuf-compiler before cargo build ({runs:?})"
    );
    let words: Vec<&str> = runs[cargo].split_whitespace().collect();
    assert!(words.contains(&"--locked"), "the image builds exactly Cargo.lock's versions: {}", runs[cargo]);
    assert!(
        words.windows(2).any(|w| w == ["--bin", "migration-apiserver"]),
        "builds the server binary: {}",
        runs[cargo]
    );
}

/// The image's profile: Cargo.toml's `[profile.<name>]` table, read as plain lines.
fn profile_settings(name: &str) -> Vec<(String, String)> {
    let toml = std::fs::read_to_string(repo().join("Cargo.toml")).expect("Cargo.toml");
    let header = format!("[profile.{name}]");
    toml.lines()
        .skip_while(|l| l.trim() != header)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

#[test]
fn the_final_stage_runs_the_built_binary_stripped_and_as_non_root() {
    let Checked { stages, build } = dockerfile();
    let build_stage = &stages[build];
    let last = stages.last().expect("final stage");
    let cargo = build_stage.all("RUN").find(|r| r.contains("cargo build")).expect("cargo build");
    let profile = profile_dir(cargo);
    let workdir = build_stage.last("WORKDIR").expect("WORKDIR");
    let produced = format!("{}/target/{profile}/migration-apiserver", workdir.trim_end_matches('/'));
    let build_name = build_stage.name.clone().unwrap_or_else(|| build.to_string());

    let copied = last
        .all("COPY")
        .map(copy_parts)
        .find(|(flags, sources, _)| {
            flags.contains(&format!("--from={build_name}").as_str()) && sources == &[produced.as_str()]
        })
        .unwrap_or_else(|| panic!("the final stage copies {produced} from stage {build_name}"));
    let entrypoint = last.last("ENTRYPOINT").expect("ENTRYPOINT");
    assert!(entrypoint.contains(copied.2), "ENTRYPOINT {entrypoint} runs the copied binary {}", copied.2);

    let user = last.last("USER").expect("the final stage sets USER");
    let uid = user.split(':').next().expect("uid");
    assert!(uid != "0" && uid != "root", "the final stage runs as non-root: USER {user}");

    // Stripped: the profile the image builds carries no debug info (release keeps line tables for profiling).
    if profile != "release" {
        let settings = profile_settings(&profile);
        let get = |k: &str| settings.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("debug"), Some("false"), "[profile.{profile}] has no debug info: {settings:?}");
        assert!(
            matches!(get("strip"), Some("debuginfo" | "symbols" | "true")),
            "[profile.{profile}] strips: {settings:?}"
        );
    } else {
        panic!("the release profile keeps debug info for profiling: the image builds a stripped profile of its own");
    }
}
