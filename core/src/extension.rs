//! Built-in extensions.
