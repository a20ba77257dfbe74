//! `migration-apiserver storage snapshot save | ls | verify | restore`: backups of the embedded store, offline (see
//! `storage::backup`; a serving store takes them with `POST /storage/snapshots` and `serve --snapshot-interval`).

use crate::storage::backup;
use crate::storage::StorageError;
use clap::Subcommand;
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Write a snapshot of the stopped server's store (a running server holds the store: use
    /// `kubectl create --raw /storage/snapshots -f /dev/null` then). Prints the snapshot's name, revision, size and
    /// checksum as JSON.
    Save(SaveArgs),
    /// List the snapshots in a snapshot directory, oldest first, from their headers (`verify` reads them whole).
    Ls(LsArgs),
    /// Read a snapshot whole and check its checksum; prints what it holds as JSON, or why it is refused.
    Verify(VerifyArgs),
    /// Restore a snapshot into a new, empty data directory; start the server with `--data-dir` set to it.
    Restore(RestoreArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub struct SaveArgs {
    /// Directory of the embedded store.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
    /// Where to write the snapshot (default: <data-dir>/snapshots).
    #[arg(long)]
    pub snapshot_dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct LsArgs {
    /// The data directory whose <data-dir>/snapshots to list (unless --snapshot-dir).
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
    /// The snapshot directory to list.
    #[arg(long)]
    pub snapshot_dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct VerifyArgs {
    /// The snapshot file.
    pub file: PathBuf,
}

#[derive(clap::Args, Debug, Clone)]
pub struct RestoreArgs {
    /// The snapshot file.
    pub file: PathBuf,
    /// The new data directory: absent or empty.
    #[arg(long)]
    pub data_dir: PathBuf,
}

/// The message alone: "storage error:" or "storage unavailable:" add nothing for a command about files.
fn plain(e: StorageError) -> anyhow::Error {
    match e {
        StorageError::Internal(m) | StorageError::Unavailable(m) => anyhow::anyhow!(m),
        e => e.into(),
    }
}

fn snapshot_dir(data_dir: &Path, snapshot_dir: Option<PathBuf>) -> PathBuf {
    snapshot_dir.unwrap_or_else(|| backup::default_dir(data_dir))
}

/// `storage snapshot ...`.
pub fn snapshot(command: SnapshotCommand) -> anyhow::Result<()> {
    match command {
        SnapshotCommand::Save(a) => {
            let dir = snapshot_dir(&a.data_dir, a.snapshot_dir);
            let info = backup::save_offline(&a.data_dir, &dir).map_err(plain)?;
            println!("{}", serde_json::to_string_pretty(&info)?);
            eprintln!("snapshot written: {}", info.path.display());
        }
        SnapshotCommand::Ls(a) => print!("{}", ls_table(&snapshot_dir(&a.data_dir, a.snapshot_dir))?),
        SnapshotCommand::Verify(a) => {
            let verified = backup::verify(&a.file).map_err(plain)?;
            println!("{}", serde_json::to_string_pretty(&verified)?);
        }
        SnapshotCommand::Restore(a) => {
            let verified = backup::restore(&a.file, &a.data_dir)
                .map_err(|e| anyhow::anyhow!("refusing to restore {}: {}", a.file.display(), plain(e)))?;
            println!("{}", serde_json::to_string_pretty(&verified)?);
            eprintln!(
                "restored revision {} ({} objects) into {}; start the server with --data-dir {}",
                verified.revision,
                verified.objects,
                a.data_dir.display(),
                a.data_dir.display()
            );
        }
    }
    Ok(())
}

/// NAME, REVISION, CREATED, OBJECTS, SIZE; a file whose header is not a snapshot's says why instead.
fn ls_table(dir: &Path) -> anyhow::Result<String> {
    let mut out = format!("{:<50} {:>10} {:<24} {:>9} {:>12}\n", "NAME", "REVISION", "CREATED", "OBJECTS", "SIZE");
    for l in backup::list(dir).map_err(plain)? {
        match l.header {
            Ok(h) => {
                let created = i64::try_from(h.created_unix_ms)
                    .ok()
                    .and_then(chrono::DateTime::from_timestamp_millis)
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_default();
                out += &format!("{:<50} {:>10} {:<24} {:>9} {:>12}\n", l.name, h.revision, created, h.objects, l.size);
            }
            Err(why) => out += &format!("{:<50} (not usable: {why})\n", l.name),
        }
    }
    Ok(out)
}
