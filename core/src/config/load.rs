//! Loading.
use super::{Config, ConfigError};
use std::path::PathBuf;
/// Loads files.
pub fn load(_paths: &[PathBuf]) -> Result<Config, Vec<ConfigError>> { Err(vec![]) }
/// Loads with an env lookup.
pub fn load_with_env(_paths: &[PathBuf], _env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Vec<ConfigError>> { Err(vec![]) }
/// Loads a string.
pub fn load_str(_name: &str, _text: &str, _env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Vec<ConfigError>> { Err(vec![]) }
