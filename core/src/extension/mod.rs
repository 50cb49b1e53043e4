//! Built-in extensions.

pub mod basicauth;
pub mod bearertokenauth;
pub mod client_auth;
pub mod file_storage;
pub mod headers_setter;
pub mod health_check;
pub mod storage;
