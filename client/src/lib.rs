//! Rust client for redis-lock (placeholder until issue 5 lands).
