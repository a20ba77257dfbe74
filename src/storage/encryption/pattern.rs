//! The `resources` patterns of an EncryptionConfiguration: which storage keys a provider list applies to.

/// A `resources` entry that is not `<resource>.<group>`, `*.<group>` or `*.*`.
#[derive(Debug, thiserror::Error)]
pub(super) enum PatternError {
    #[error("must not be empty")]
    Empty,
    #[error("{0:?} must be lowercase (resource.group, as in shootstates.core.gardener.cloud)")]
    NotLowercase(String),
    #[error("{0:?} is not a resource: use <resource>.<group>, *.<group> or *.*")]
    NotAResource(String),
}

/// One `resources` pattern: `shootstates.core.gardener.cloud`, `*.core.gardener.cloud`, `*.*`, `secrets`, `*.`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Pattern {
    All,
    /// Every resource of a group (`""` is the core group).
    Group(String),
    /// One resource of a group.
    Resource {
        resource: String,
        group: String,
    },
}

impl Pattern {
    pub(super) fn parse(s: &str) -> std::result::Result<Pattern, PatternError> {
        if s.is_empty() {
            return Err(PatternError::Empty);
        }
        if s != s.to_ascii_lowercase() {
            return Err(PatternError::NotLowercase(s.to_string()));
        }
        if s == "*.*" {
            return Ok(Pattern::All);
        }
        let (resource, group) = s.split_once('.').unwrap_or((s, ""));
        if group.contains('*') || (resource.contains('*') && resource != "*") || resource.is_empty() {
            return Err(PatternError::NotAResource(s.to_string()));
        }
        if resource == "*" {
            return Ok(Pattern::Group(group.to_owned()));
        }
        Ok(Pattern::Resource { resource: resource.to_owned(), group: group.to_owned() })
    }

    /// Whether the storage key `/registry/<group>/<resource>/...` (`/registry/<resource>/...` for the core group)
    /// belongs to this pattern.
    pub(super) fn matches(&self, key: &str) -> bool {
        let Some(rest) = key.strip_prefix("/registry/") else {
            return matches!(self, Pattern::All);
        };
        let first = rest.split('/').next().unwrap_or_default();
        match self {
            Pattern::All => true,
            // Group names have a dot, core resources do not.
            Pattern::Group(g) if g.is_empty() => !first.contains('.'),
            Pattern::Group(g) => first == g,
            Pattern::Resource { resource, group } if group.is_empty() => first == resource,
            Pattern::Resource { resource, group } => {
                first == group
                    && rest[first.len()..].strip_prefix('/').and_then(|r| r.split('/').next()) == Some(resource)
            }
        }
    }
}
