//! Placeholder, replaced by the watch hub implementation.
pub struct WatchHub;
