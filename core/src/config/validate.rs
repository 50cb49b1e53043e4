//! Validation.
use super::{Config, ConfigError};
use crate::registry::Registry;
/// Validates.
pub fn validate(_c: &Config, _r: &Registry) -> Vec<ConfigError> { vec![] }
