//! Placeholder, replaced by the redb backend.
