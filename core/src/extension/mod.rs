//! Built-in extensions.

pub mod health_check;
pub mod storage;
