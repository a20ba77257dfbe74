//! How many keys the embedded store holds under each directory-like prefix (every prefix of a key that ends in
//! `/`: `/registry/<group>/<resource>/` and `/registry/<group>/<resource>/<namespace>/` among them), kept in the
//! same write transactions as the objects.
//!
//! Why: a chunked list's first page reports how many items follow it (`remainingItemCount`). Counting them means
//! walking the whole collection, which at 10^6 objects made every first page take over a second. With the counts,
//! the first page's remaining is `count(prefix) - page size`, read in the same snapshot as the page.

use super::{Result, StorageError};
use redb::{ReadOnlyTable, ReadableTable, Table, TableDefinition, WriteTransaction};
use std::collections::BTreeMap;

pub const COUNTS: TableDefinition<&str, u64> = TableDefinition::new("counts");
/// Marks (in the `meta` table) a store whose counts are complete; stores written before counts existed get them
/// computed once, when opened.
const COUNTED: &str = "counted";

fn unavailable(e: impl std::fmt::Display) -> StorageError {
    StorageError::Unavailable(format!("redb: {e}"))
}

/// The prefixes of `key` that end in `/` (not the key itself).
fn dir_prefixes(key: &str) -> impl Iterator<Item = &str> {
    key.match_indices('/').map(move |(i, _)| &key[..=i]).filter(move |p| p.len() < key.len())
}

/// Counts `key` in (`delta` 1) or out (`delta` -1) of every prefix it is under.
pub fn add(counts: &mut Table<&str, u64>, key: &str, delta: i64) -> Result<()> {
    for prefix in dir_prefixes(key) {
        let now = counts.get(prefix).map_err(unavailable)?.map_or(0, |g| g.value());
        let next = now.saturating_add_signed(delta);
        if next == 0 {
            counts.remove(prefix).map_err(unavailable)?;
        } else {
            counts.insert(prefix, next).map_err(unavailable)?;
        }
    }
    Ok(())
}

/// Keys under `prefix`, when it is one the counts keep (ends in `/`); `None` otherwise (the caller counts).
pub fn count(counts: &ReadOnlyTable<&str, u64>, prefix: &str) -> Result<Option<u64>> {
    if !prefix.ends_with('/') {
        return Ok(None);
    }
    Ok(Some(counts.get(prefix).map_err(unavailable)?.map_or(0, |g| g.value())))
}

/// Computes the counts of a store that has none yet (one pass over `objects`), in the opening transaction.
pub fn build_if_missing(
    txn: &WriteTransaction,
    objects: TableDefinition<&str, &[u8]>,
    meta: TableDefinition<&str, u64>,
) -> Result<()> {
    let mut marks = txn.open_table(meta).map_err(unavailable)?;
    if marks.get(COUNTED).map_err(unavailable)?.is_some() {
        return Ok(());
    }
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let mut keys = 0u64;
    {
        let objects = txn.open_table(objects).map_err(unavailable)?;
        for entry in objects.iter().map_err(unavailable)? {
            let (k, _) = entry.map_err(unavailable)?;
            keys += 1;
            for prefix in dir_prefixes(k.value()) {
                *totals.entry(prefix.to_owned()).or_default() += 1;
            }
        }
    }
    let mut counts = txn.open_table(COUNTS).map_err(unavailable)?;
    counts.retain(|_, _| false).map_err(unavailable)?;
    for (prefix, n) in &totals {
        counts.insert(prefix.as_str(), n).map_err(unavailable)?;
    }
    marks.insert(COUNTED, 1).map_err(unavailable)?;
    if keys > 0 {
        tracing::info!(keys, prefixes = totals.len(), "counted the stored keys per prefix (once, for this store)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::dir_prefixes;

    #[test]
    fn prefixes_of_a_key() {
        let all: Vec<&str> = dir_prefixes("/registry/g/r/ns/name").collect();
        assert_eq!(all, ["/", "/registry/", "/registry/g/", "/registry/g/r/", "/registry/g/r/ns/"]);
        assert_eq!(dir_prefixes("/p/").collect::<Vec<_>>(), ["/"]);
        assert!(dir_prefixes("plain").next().is_none());
    }
}
